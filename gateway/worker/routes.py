"""Where the media tick hands one SIP call's frames and packets (compiled with the tick: gateway/compiled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from gateway.media.early import EarlyMedia
    from gateway.media.inband import InbandDtmf
    from gateway.session.session import CallSession
    from gateway.transport.rtp_socket import RtpEndpoint
    from gateway.worker.bridge import Bridge
    from gateway.worker.sip_leg import CallLeg


@final
class TickRoute:
    """One SIP call's session and RTP sockets, read once per call and direction every tick. :class:`CallLeg` is
    not compiled (its controls hold it weakly, ADR 0006), so each of its attributes costs the compiled tick a
    dictionary lookup; these are fields of a compiled class.

    Made when the call's media starts, with the leg's RTP sockets (which stay the leg's until its media is
    released, when the route goes); the session joins it when it is made, which may be later. A leg in a warm
    transfer's bridge (gateway/worker/bridge.py) has its ``bridge``: its inbound frames go there, not to a session,
    and once the bridge is joined its outbound frames come from there."""

    __slots__ = ("bridge", "early", "inband", "leg", "level_phase", "rtp", "session")

    def __init__(self, leg: CallLeg, rtp: RtpEndpoint, inband: InbandDtmf | None = None) -> None:
        self.leg = leg
        self.inband = inband  # calls without telephone-event: DTMF as audio both ways (gateway/media/inband.py)
        self.rtp = rtp
        self.session: CallSession | None = leg.session
        self.level_phase = leg.level_phase
        self.early: EarlyMedia | None = leg.early  # while set, the call is in early media (before the 200 OK)
        self.bridge: Bridge | None = leg.bridge
