"""The ports the worker's parts are built with: each part names what it uses, never the worker that composes it.

* :class:`CallHost`: what carrying a call needs of its worker (spawn a task, a provider model, admission's
  capacity check, the control-plane link, "a call is gone"). ``MediaWorker`` implements it; tests use a small
  stand-in (``WebRtcCalls`` uses only this).
* :class:`SipSignalling`: the SIP endpoint (sans-I/O) and its transport, as actions that each pump what they
  produced onto the wire, so no action can forget to.
* :class:`MediaPlant`: the tick engine, the RTP port pool, the routes the tick reads, and the media clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.sip.config import CONFIGURED_PROXY, ProxyChoice

if TYPE_CHECKING:
    from gateway.fleet.models import ProfileModel
    from gateway.fleet.protocols import ControlLink
    from gateway.media.tick import TickEngine
    from gateway.providers.base import RealtimeModel
    from gateway.session.amd_listen import GreetingTranscribing
    from gateway.session.config import SessionConfig
    from gateway.sip.auth import ClientCredentials
    from gateway.sip.endpoint import SipEndpoint
    from gateway.sip.events import CallHandle
    from gateway.sip.registration import RegistrationClient, RegistrationConfig
    from gateway.transport.rtp_socket import RtpDrain, RtpPortPool
    from gateway.transport.sip_transport import SipTransport
    from gateway.worker.counters import CounterExporter
    from gateway.worker.recorder import Recordings
    from gateway.worker.routes import TickRoute


class CallHost(Protocol):
    """What the calls of one worker use of it."""

    id: str
    link: ControlLink | None  # None: no control plane (tests, embedding): calls take the default profile
    session_config: SessionConfig
    default_profile: ProfileModel  # the agent profile of calls admitted without a control plane
    counters: CounterExporter  # a call's last figures, exported when it ends
    amd_recognisers: GreetingTranscribing | None  # builds a profile's amd_stt (None: only the provider's own)

    @property
    def draining(self) -> bool:
        """True while the worker takes no new calls (a drain or a shutdown)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` as a task the worker owns (awaited when it closes)."""
        ...

    def model_for(self, provider: str) -> RealtimeModel: ...

    def over_capacity(self) -> bool:
        """Whether the worker's live calls (this one included) take more than its capacity."""
        ...

    def call_ended(self) -> None:
        """A call is gone (a draining worker may now exit)."""
        ...


class SipSignalling:
    """The worker's SIP endpoint and its transport: every action is the endpoint's, then a pump."""

    def __init__(self, endpoint: SipEndpoint, transport: SipTransport) -> None:
        self.endpoint = endpoint
        self.transport = transport

    def now(self) -> float:
        return self.transport.now()

    def ring(self, call: CallHandle, *, status: int = 180, body: bytes = b"") -> None:
        """180 Ringing for an offered call, or 183 with early media's SDP (nothing once it is no longer offered)."""
        self.endpoint.ring(call, self.now(), status=status, body=body)
        self.transport.pump()

    def answer(self, call: CallHandle, body: bytes) -> None:
        self.endpoint.answer(call, self.now(), body=body)
        self.transport.pump()

    def reject(self, call: CallHandle, status: int, reason: str, *, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Refuse an offered call (LocalProtocolError when it is no longer offered: cancelled meanwhile)."""
        try:
            self.endpoint.reject(call, self.now(), status=status, reason=reason, headers=headers)
        finally:
            self.transport.pump()

    def hang_up(self, call: CallHandle, reason: str, *, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """BYE, CANCEL or 480 as the call's state requires; nothing for a call that has ended."""
        self.endpoint.hang_up(call, self.now(), reason=reason, headers=headers)
        self.transport.pump()

    def invite(
        self,
        request_uri: str,
        *,
        from_uri: str,
        body: bytes,
        credentials: ClientCredentials | None,
        outbound_proxy: ProxyChoice = CONFIGURED_PROXY,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> CallHandle:
        """Place a call (LocalProtocolError for a bad URI, or sips: without TLS here); a trunk's own proxy."""
        call = self.endpoint.invite(
            request_uri,
            self.now(),
            from_uri=from_uri,
            body=body,
            credentials=credentials,
            outbound_proxy=outbound_proxy,
            headers=headers,
        )
        self.transport.pump()
        return call

    def transport_of(self, call: CallHandle) -> str:
        return self.endpoint.transport_of(call) or ""

    def refer(self, call: CallHandle, target_uri: str) -> None:
        """Blind transfer (LocalProtocolError for a target that is not a URI)."""
        self.endpoint.refer(call, self.now(), target_uri=target_uri)
        self.transport.pump()

    def replaces_target(self, call: CallHandle) -> str | None:
        """The Refer-To that sends another peer to this call's far end, replacing its dialog (RFC 3891)."""
        return self.endpoint.replaces_target(call)

    def accept_refer(self, call: CallHandle) -> None:
        """202 to the peer's REFER and NOTIFY 100 Trying (gateway/sip/refer_sub.py)."""
        try:
            self.endpoint.accept_refer(call, self.now())
        finally:
            self.transport.pump()

    def decline_refer(self, call: CallHandle, status: int, reason: str) -> None:
        try:
            self.endpoint.decline_refer(call, self.now(), status=status, reason=reason)
        finally:
            self.transport.pump()

    def notify_refer(self, call: CallHandle, status: int, reason: str) -> None:
        """NOTIFY the referrer of the new call's status (LocalProtocolError: no REFER of that call)."""
        try:
            self.endpoint.notify_refer(call, self.now(), status=status, reason=reason)
        finally:
            self.transport.pump()

    def peer_allows(self, call: CallHandle, method: str) -> bool:
        """The peer's Allow (its INVITE's, or its 2xx's) lists the method."""
        return self.endpoint.peer_allows(call, method)

    def send_dtmf_info(self, call: CallHandle, digit: str) -> None:
        """One digit as INFO application/dtmf-relay (LocalProtocolError for a digit that is not one)."""
        self.endpoint.send_dtmf_info(call, self.now(), digit=digit)
        self.transport.pump()

    def answer_reinvite(self, call: CallHandle, body: bytes) -> None:
        self.endpoint.answer_reinvite(call, self.now(), body=body)
        self.transport.pump()

    def reinvite(self, call: CallHandle, body: bytes) -> None:
        """Our re-INVITE with a new offer (hold: a=sendonly; resume: a=sendrecv)."""
        self.endpoint.reinvite(call, self.now(), body=body)
        self.transport.pump()

    def reject_reinvite(self, call: CallHandle, status: int, reason: str | None = None) -> None:
        self.endpoint.reject_reinvite(call, self.now(), status=status, reason=reason)
        self.transport.pump()

    def set_accepting_calls(self, accepting: bool) -> None:
        """False: new INVITEs and out-of-dialog OPTIONS are answered 503 (a draining worker)."""
        self.endpoint.set_accepting_calls(accepting)

    def register(self, config: RegistrationConfig) -> RegistrationClient:
        client = self.endpoint.registrations.add(config, self.now())
        self.transport.pump()
        return client

    def unregister(self, client: RegistrationClient, *, within: float) -> None:
        self.endpoint.registrations.stop(client, self.now(), within=within)
        self.transport.pump()


@dataclass(eq=False)
class MediaPlant:
    """The media of SIP calls: the tick engine, RTP ports, and where the tick hands each call's frames."""

    engine: TickEngine
    ports: RtpPortPool
    # RTP sockets read by the tick (ADR 0007); None: read per readiness callback (ADR 0002).
    rtp_drain: RtpDrain | None = None
    # Every call whose media is in the engine: kept by SipCalls, read by the tick.
    routes: dict[str, TickRoute] = field(default_factory=dict)
    # The recorded calls' recorders, filled by the tick, and the writer thread behind them.
    recordings: Recordings | None = None

    def now(self) -> float:
        """The loop's clock, which the tick and the engine's statistics run on."""
        return asyncio.get_running_loop().time()
