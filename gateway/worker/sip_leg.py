"""One SIP call as the worker sees it: its dialog, RTP sockets, media state and session, and its call control.

:class:`CallLeg` is the SIP kind of :class:`gateway.worker.legs.Leg`: its bookkeeping, and the commands, which
it hands to the :class:`SipLegOwner` that carries it (``SipCalls``). :class:`SipCallControl` is how a session
acts on its call (hang up, blind transfer with REFER/NOTIFY, RFC 4733 DTMF to the caller).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import (
    CallSnapshot,
    ProfileModel,
    RecordingModel,
    ReferPolicyModel,
    ReferralLine,
    TransferLine,
    WarmTransferRequest,
)
from gateway.media.call import MediaStats
from gateway.media.errors import LocalMediaError
from gateway.session.amd_gate import AmdPolicy
from gateway.session.control import TransferOutcome, WarmTransferStart
from gateway.session.session import CallSession
from gateway.sip.caller_context import CallContext
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import CallHandle
from gateway.sip.offer_answer import OfferAnswer
from gateway.sip.sdp import NegotiatedMedia
from gateway.tracing import CallTrace
from gateway.transport.rtp_socket import RtpEndpoint
from gateway.worker.legs import LegKind, LegState
from gateway.worker.transfer import WarmTransferError

if TYPE_CHECKING:
    from gateway.media.early import EarlyMedia
    from gateway.sip.early_media import EarlyDialogs
    from gateway.worker.bridge import Bridge
    from gateway.worker.transfer import WarmTransfer

LEVEL_EVERY_TICKS = 25  # one caller level sample per 0.5 s for the dashboard sparkline
# Calls take turns: each leg is sampled on its own tick of every LEVEL_EVERY_TICKS, so no tick samples them all
# (at 200 calls, sampling every call on one tick made that tick 8 ms longer, and it overran).
_level_phases = itertools.cycle(range(LEVEL_EVERY_TICKS))


class SipLegOwner(Protocol):
    """What carries SIP legs (``gateway.worker.sip_calls.SipCalls``): the actions a leg's commands become."""

    def end(self, leg: CallLeg, reason: str) -> None: ...

    def send_dtmf_leg(self, leg: CallLeg, digits: str) -> None: ...

    def refer_leg(self, leg: CallLeg, target: str) -> None: ...

    def start_transfer(self, leg: CallLeg, target: str) -> None: ...

    def start_hold(self, leg: CallLeg, held: bool) -> None: ...

    def snapshot_of(self, leg: CallLeg) -> CallSnapshot: ...

    async def start_warm_transfer(
        self, leg: CallLeg, request: WarmTransferRequest, *, initiator: Literal["agent", "api"]
    ) -> TransferLine: ...


@dataclass(eq=False)
class CallLeg:
    id: str
    sip: CallHandle | None
    direction: Literal["inbound", "outbound"]
    from_uri: str
    to_uri: str
    owner: SipLegOwner
    kind: LegKind = "sip"
    source: str = ""
    transport: str = ""  # the SIP transport of its INVITE: udp, tcp or tls
    route: str = ""
    profile: ProfileModel | None = None
    context: CallContext | None = None  # set once admitted (inbound: from the INVITE)
    provider: str = ""  # the provider actually used (profiles may say "default")
    state: LegState = LegState.ADMITTED
    rtp: RtpEndpoint | None = None
    sdp: OfferAnswer | None = None  # the call's offer/answer: codec, direction, SRTP keys, our o= line
    session: CallSession | None = None
    trace: CallTrace | None = None  # the call's spans on this worker (gateway/tracing.py)
    media_added: bool = False
    last_media: MediaStats | None = None
    started_wall: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    answered_wall: float | None = None
    ended_wall: float | None = None
    end_reason: str = ""
    task: asyncio.Task[None] | None = None
    referral: asyncio.Future[TransferOutcome] | None = None  # our REFER's outcome, while it is pending
    transfer_seen_progress: bool = False
    hold_pending: bool | None = None  # our re-INVITE that holds (True) or resumes (False) awaits its answer
    answered: asyncio.Future[bool] | None = None  # outbound: resolved on answer / failure
    levels: deque[float] = field(default_factory=lambda: deque(maxlen=120))
    last_level: float | None = None
    level_phase: int = field(default_factory=lambda: next(_level_phases))  # tick_no % LEVEL_EVERY_TICKS to sample on
    tick_count: int = 0
    cost: float = 1.0  # of the worker's capacity: 1 for G.711 (CapacitySettings.call_cost) plus agent_cost
    agent_cost: float = 0.0  # what the agent takes here (CapacitySettings.agent_cost), set with the session
    recording: RecordingModel | None = None  # where the call is being recorded; final once the call ended
    amd: AmdPolicy | None = None  # outbound answering-machine detection (POST /v1/calls amd), None: off
    # Early media (gateway/worker/early_media.py): the tick's side while it lasts, the forks' 18x, its frame counts.
    early: EarlyMedia | None = None
    early_dialogs: EarlyDialogs | None = None
    early_heard: int = 0
    early_sent: int = 0
    trunk: str | None = None  # the route's trunk, for numbers this call dials on (warm transfer, a REFER's tel:)
    via_trunk: str | None = None  # the trunk its INVITE came in on (by source) or went out through; on its record
    refer_policy: ReferPolicyModel | None = None  # what a peer's REFER may do (the route's; None: declined)
    referrals: list[ReferralLine] = field(default_factory=list)  # the peer's REFERs (gateway/worker/referred.py)
    refer_replaces: bool = False  # its INVITE offered REFER (Allow) and Replaces (Supported): warm transfer's auto
    warm: WarmTransfer | None = (
        None  # the warm transfer this leg is the caller or the human of (gateway/worker/warm.py)
    )
    bridge: Bridge | None = (
        None  # its audio goes through this bridge (the human's from its answer, the caller's once joined)
    )

    @property
    def live(self) -> bool:
        return self.state is not LegState.ENDED

    @property
    def negotiated(self) -> NegotiatedMedia | None:
        """The call's audio as offer/answer left it; None until it is negotiated."""
        return self.sdp.media if self.sdp is not None else None

    async def snapshot(self) -> CallSnapshot:
        return self.owner.snapshot_of(self)

    def hang_up(self, reason: str) -> None:
        self.owner.end(self, reason)

    def send_dtmf(self, digits: str) -> None:
        self.owner.send_dtmf_leg(self, digits)

    def transfer(self, target: str) -> None:
        self.owner.start_transfer(self, target)

    def hold(self, held: bool) -> None:
        self.owner.start_hold(self, held)


class SipCallControl:
    """The session's CallControl of a SIP call, over the leg's owner (SipCalls: the SIP endpoint, the media tick).

    It holds its leg weakly: the leg owns the session, which owns this control, and a strong reference back
    would make every ended call a reference cycle that only a full GC pass frees (docs/adr/0006-gc-freeze.md).
    """

    def __init__(self, leg: CallLeg, *, transfer_timeout_s: float = 30.0) -> None:
        self._leg_ref = weakref.ref(leg)
        self._transfer_timeout_s = transfer_timeout_s

    async def hang_up(self, reason: str) -> None:
        leg = self._leg_ref()
        if leg is not None:  # a leg that is gone has ended already
            leg.owner.end(leg, reason)

    async def send_dtmf(self, digits: str) -> None:
        leg = self._leg_ref()
        if leg is None:
            raise LocalMediaError("the call has ended")
        leg.owner.send_dtmf_leg(leg, digits)

    async def hold(self, held: bool) -> None:
        leg = self._leg_ref()
        if leg is None:
            raise LocalMediaError("the call has ended")
        leg.owner.start_hold(leg, held)

    async def warm_transfer(
        self, target: str, summary: str, briefing: Literal["spoken", "conversation"] | None = None
    ) -> WarmTransferStart:
        leg = self._leg_ref()
        if leg is None or not leg.live:
            return WarmTransferStart(status="refused", detail="the call has ended")
        try:
            request = WarmTransferRequest(target=target, summary=summary, briefing=briefing)
            line = await leg.owner.start_warm_transfer(leg, request, initiator="agent")
        except (CommandRejectedError, ValueError) as exc:
            return WarmTransferStart(status="refused", detail=str(exc))
        return WarmTransferStart(status="dialling", transfer_id=line.id)

    async def end_briefing(self, *, connect: bool, reason: str = "") -> str:
        """The conversational briefing's connect_caller / decline_transfer (BriefingControl, gateway/worker/warm.py)."""
        leg = self._leg_ref()
        transfer = leg.warm if leg is not None else None
        if leg is None or transfer is None or transfer.human_id != leg.id or transfer.briefing != "conversation":
            return "this call is not a warm transfer's briefing"
        try:
            if connect:
                transfer.ask_join("agent")
            else:
                transfer.decline(reason)
        except WarmTransferError as exc:
            return str(exc)
        return ""

    async def transfer(self, target: str) -> TransferOutcome:
        leg = self._leg_ref()
        if leg is None or not leg.live or leg.sip is None:
            return TransferOutcome(status="failed", detail="call is not up")
        if leg.referral is not None and not leg.referral.done():
            return TransferOutcome(status="refused", detail="a transfer is already in progress")
        loop = asyncio.get_running_loop()
        leg.referral = loop.create_future()
        leg.transfer_seen_progress = False
        try:
            leg.owner.refer_leg(leg, target)
        except LocalProtocolError as exc:  # a target that is not a SIP URI or number, a dialog not up
            leg.referral = None
            return TransferOutcome(status="refused", detail=str(exc))
        try:
            return await asyncio.wait_for(asyncio.shield(leg.referral), timeout=self._transfer_timeout_s)
        except TimeoutError:
            return TransferOutcome(status="failed", detail="no final NOTIFY before the timeout")
