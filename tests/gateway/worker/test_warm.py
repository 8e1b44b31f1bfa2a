"""The warm transfer's orchestration (gateway/worker/warm.py) over fake legs, sessions and SIP calls: what each
outcome does to the caller, the human's leg, the routes and the reports."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import AdmissionDecision, OriginateRequest, ProfileModel, WarmTransferRequest
from gateway.session.control import TransferOutcome
from gateway.session.session import CallSession
from gateway.session.state import CallState
from gateway.worker import warm as warm_module
from gateway.worker.legs import LegState, begin_end
from gateway.worker.sip_leg import CallLeg, SipCallControl
from gateway.worker.slices import WarmTransferSettings
from gateway.worker.transfer import WarmState
from gateway.worker.warm import WarmTransfers

DEADLINE = 5.0


@dataclass
class FakeStats:
    frames_out: int = 0


@dataclass
class FakeSession:
    state: CallState = CallState.ACTIVE
    held: str | None = None
    agent_idle: bool = False
    frames_out: int = 0
    notes: list[tuple[str, bool]] = field(default_factory=list)
    holds: list[bool] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    transcript: tuple[Any, ...] = ()

    def stats(self) -> FakeStats:
        return FakeStats(frames_out=self.frames_out)

    def set_held(self, held: bool, *, by: str) -> bool:
        self.holds.append(held)
        self.held = by if held else None
        return True

    def inject(self, text: str, *, role: str, respond: bool = False) -> None:
        self.notes.append((text, respond))

    async def aclose(self, reason: str = "closed") -> None:
        self.closed.append(reason)
        self.state = CallState.ENDED


class FakeRoute:
    """What the transfer reads and sets of a leg's TickRoute (made as TickRoute makes it: from the leg)."""

    def __init__(self, leg: CallLeg) -> None:
        self.bridge = leg.bridge
        self.session = leg.session


class FakeCalls:
    """What WarmTransfers needs of SipCalls; ``end`` does what SipCalls.end does for a transfer."""

    def __init__(self) -> None:
        self.legs: dict[str, CallLeg] = {}
        self.routes: dict[str, FakeRoute] = {}
        self.reports: list[tuple[str, str, dict[str, Any]]] = []
        self.originated: list[tuple[OriginateRequest, AdmissionDecision]] = []
        self.referral: asyncio.Future[TransferOutcome] | None = None

    def leg(self, call_id: str, *, direction: str = "inbound", media: bool = True) -> CallLeg:
        leg = CallLeg(
            id=call_id,
            sip=None,
            direction=direction,  # type: ignore[arg-type]
            from_uri="sip:+15550100@caller.example",
            to_uri="sip:agent@gw",
            owner=cast(Any, self),
            route="support",
            profile=ProfileModel(name="support", provider="openai"),
            state=LegState.ACTIVE,
        )
        self.legs[call_id] = leg
        if media:
            self.routes[call_id] = FakeRoute(leg)
        return leg

    def answer(self, human: CallLeg) -> None:
        """The human answers: their media starts (its route, as SipCalls._start_media makes it)."""
        self.routes[human.id] = FakeRoute(human)
        human.state = LegState.ACTIVE
        assert human.answered is not None
        human.answered.set_result(True)

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        self.originated.append((request, admission))
        human = self.leg(admission.call_id, direction="outbound", media=False)
        human.state = LegState.RINGING
        human.answered = asyncio.get_running_loop().create_future()
        return human.id

    def end(self, leg: CallLeg, reason: str) -> None:
        if not begin_end(leg, reason):
            return
        if leg.warm is not None:
            leg.warm.leg_ended(leg.id)
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(False)

    def sip_leg(self, call_id: str) -> CallLeg | None:
        return self.legs.get(call_id)

    def route_of(self, call_id: str) -> FakeRoute | None:
        return self.routes.get(call_id)

    def report_transfer(self, kind: str, leg: CallLeg, data: dict[str, Any]) -> None:
        self.reports.append((kind, leg.id, data))

    def spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=name)

    async def refer_replacing(self, caller: CallLeg, human: CallLeg) -> TransferOutcome:
        """The REFER's outcome is what the test sets on ``referral`` (made here)."""
        self.referral = asyncio.get_running_loop().create_future()
        return await self.referral


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(DEADLINE):
        while not predicate():  # noqa: ASYNC110 (the transfer's state, no event to wait for)
            await asyncio.sleep(0.005)


def _setup(**settings: Any) -> tuple[FakeCalls, WarmTransfers, CallLeg, FakeSession]:
    calls = FakeCalls()
    warm = WarmTransfers(cast(Any, calls), WarmTransferSettings(**settings))
    caller = calls.leg("c-caller")
    session = FakeSession()
    caller.session = cast(CallSession, session)
    return calls, warm, caller, session


REQUEST = WarmTransferRequest(target="sales", summary="Wants the annual plan.")


async def test_a_busy_human_brings_the_caller_back_and_the_agent_is_told() -> None:
    calls, warm, caller, session = _setup(warm_transfer_queues=("sales=sip:queue@pbx",))
    transfer = await warm.start(caller, REQUEST, initiator="api")
    ((request, admission),) = calls.originated
    assert request.to == "sip:queue@pbx" and admission.profile is not None
    assert "Wants the annual plan." in admission.profile.greeting and admission.profile.tools == []
    assert session.held == "gateway", "the caller waits on hold"
    human = calls.legs[transfer.human_id]
    assert human.bridge is transfer.bridge, "its route takes the bridge when its media starts"
    human.end_reason = "sip_486"
    calls.end(human, "sip_486")
    await _until(lambda: transfer.state is WarmState.FAILED)
    assert session.held is None and session.notes == [
        (
            "The transfer to sip:queue@pbx did not go through (the line was busy). The caller is back with you and "
            "can hear you again: tell them, and offer what else you can do.",
            True,
        )
    ]
    assert [kind for kind, _, _ in calls.reports] == ["call.transfer_started", "call.transfer_failed"]
    assert calls.reports[-1][2]["outcome"] == "sip_486" and warm.outcomes == {"failed": 1}
    assert caller.bridge is None and not transfer.bridge.joined
    # Another transfer may start now.
    again = await warm.start(caller, REQUEST, initiator="agent")
    assert again.state is WarmState.DIALLING


async def test_a_number_is_dialled_through_the_trunk_of_the_callers_route_a_uri_as_it_is() -> None:
    calls, warm, caller, _ = _setup(warm_transfer_queues=("sales=+15550142",))
    caller.trunk = "b"
    await warm.start(caller, REQUEST, initiator="api")
    ((request, _),) = calls.originated
    assert (request.to, request.trunk) == ("+15550142", "b")
    calls, warm, caller, _ = _setup()
    caller.trunk = "b"
    await warm.start(caller, WarmTransferRequest(target="sip:h@pbx"), initiator="api")
    ((request, _),) = calls.originated
    assert (request.to, request.trunk) == ("sip:h@pbx", None)


async def test_the_caller_may_stay_with_the_agent_while_the_human_rings() -> None:
    calls, warm, caller, session = _setup()
    request = WarmTransferRequest(target="sip:h@pbx", caller_hears="agent")
    transfer = await warm.start(caller, request, initiator="api")
    assert session.holds == [], "no hold: the agent goes on talking with the caller"
    calls.end(calls.legs[transfer.human_id], "no_answer")
    await _until(lambda: transfer.state is WarmState.FAILED)
    assert session.holds == [] and "nobody answered" in session.notes[0][0]


async def test_a_briefed_human_is_joined_and_the_agent_leaves() -> None:
    calls, warm, caller, session = _setup()
    transfer = await warm.start(caller, REQUEST, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    assert calls.routes[human.id].bridge is transfer.bridge, "the human's audio goes to the bridge, never the agent"
    await _until(lambda: transfer.state is WarmState.BRIEFING)
    briefing = FakeSession()
    human.session = cast(CallSession, briefing)
    briefing.frames_out, briefing.agent_idle = 40, True  # the summary was spoken and played out
    await _until(lambda: transfer.state is WarmState.BRIDGED)
    await _until(lambda: session.closed and briefing.closed)
    assert transfer.briefed and transfer.bridge.joined and caller.bridge is transfer.bridge
    for leg in (caller, human):
        assert calls.routes[leg.id].bridge is transfer.bridge and calls.routes[leg.id].session is None
    assert (session.closed, briefing.closed) == (["transferred"], ["briefed"])
    assert session.held is None and not session.notes
    # The caller hangs up: the human gets a BYE.
    calls.end(caller, "caller_hangup")
    await _until(lambda: transfer.state is WarmState.ENDED)
    assert human.end_reason == "peer_hangup" and transfer.outcome == "caller_hangup"
    assert [kind for kind, _, _ in calls.reports] == ["call.transfer_started", "call.transferred"]


async def test_a_briefing_that_never_ends_joins_them_unbriefed() -> None:
    calls, warm, caller, _ = _setup(warm_transfer_brief_timeout_s=0.1)
    transfer = await warm.start(caller, REQUEST, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    human.session = cast(CallSession, FakeSession(frames_out=10, agent_idle=False))  # still talking
    await _until(lambda: transfer.state is WarmState.BRIDGED)  # after the 0.1 s of the briefing's timeout
    assert not transfer.briefed


async def test_the_caller_leaving_while_the_human_rings_cancels_the_human() -> None:
    calls, warm, caller, _ = _setup()
    transfer = await warm.start(caller, REQUEST, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.end(caller, "caller_hangup")
    await _until(lambda: transfer.state is WarmState.ENDED)
    assert human.end_reason == "caller_hangup" and warm.outcomes == {"ended": 1}


async def test_what_cannot_be_transferred_is_refused() -> None:
    calls, warm, caller, session = _setup()
    session.held = "caller"
    with pytest.raises(CommandRejectedError, match="on hold"):
        await warm.start(caller, REQUEST, initiator="api")
    session.held = None
    transfer = await warm.start(caller, REQUEST, initiator="api")
    with pytest.raises(CommandRejectedError, match="is dialling"):
        await warm.start(caller, REQUEST, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    human.session = cast(CallSession, FakeSession())  # the briefing session, up
    with pytest.raises(CommandRejectedError, match="human leg"):
        await warm.start(human, REQUEST, initiator="agent")
    caller.session = None
    with pytest.raises(CommandRejectedError, match="agent is not up"):
        await warm.start(caller, REQUEST, initiator="api")


async def _bridged(calls: FakeCalls, warm: WarmTransfers, caller: CallLeg, request: WarmTransferRequest) -> Any:
    transfer = await warm.start(caller, request, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    human.session = cast(CallSession, FakeSession(frames_out=40, agent_idle=True))
    await _until(lambda: transfer.state is WarmState.BRIDGED)
    return transfer, human


async def test_auto_refers_only_a_caller_whose_invite_offered_replaces() -> None:
    calls, warm, caller, _ = _setup(warm_transfer_refer="auto")
    transfer, _ = await _bridged(calls, warm, caller, REQUEST)
    assert not transfer.refer and transfer.handoff_detail == "the caller's INVITE did not offer REFER and Replaces"
    calls, warm, caller, _ = _setup(warm_transfer_refer="auto")
    caller.refer_replaces = True
    transfer, _ = await _bridged(calls, warm, caller, REQUEST)
    await _until(lambda: calls.referral is not None)
    assert transfer.refer and transfer.handoff_detail == ""


async def test_a_refer_refused_keeps_the_bridge_and_says_why() -> None:
    calls, warm, caller, _ = _setup()
    transfer, human = await _bridged(calls, warm, caller, REQUEST.model_copy(update={"handoff": "refer"}))
    await _until(lambda: calls.referral is not None)
    assert calls.referral is not None
    calls.referral.set_result(TransferOutcome(status="refused", sip_status=501, detail="Not Implemented"))
    await _until(lambda: transfer.handoff_detail != "")
    assert transfer.handoff_detail == "REFER refused 501: Not Implemented" and transfer.state is WarmState.BRIDGED
    assert caller.live and human.live and transfer.handoff == "bridge"
    calls.end(human, "peer_hangup")  # the bridge goes on until a side hangs up, as without a REFER
    await _until(lambda: transfer.state is WarmState.ENDED)
    assert caller.end_reason == "human_hangup" and transfer.outcome == "human_hangup"


async def test_a_human_gone_while_the_refer_is_pending_counts_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gateway.worker.warm as warm_module

    monkeypatch.setattr(warm_module, "HANDOFF_GRACE_S", 0.05)
    calls, warm, caller, _ = _setup()
    transfer, human = await _bridged(calls, warm, caller, REQUEST.model_copy(update={"handoff": "refer"}))
    await _until(lambda: calls.referral is not None)
    calls.end(human, "peer_hangup")  # and no NOTIFY ever comes
    await _until(lambda: transfer.state is WarmState.ENDED)
    assert caller.end_reason == "human_hangup" and transfer.handoff == "bridge"
    assert transfer.handoff_detail == "REFER: a leg ended before its outcome"


async def test_a_refer_accepted_ends_both_legs_as_transferred() -> None:
    calls, warm, caller, _ = _setup()
    transfer, human = await _bridged(calls, warm, caller, REQUEST.model_copy(update={"handoff": "refer"}))
    await _until(lambda: calls.referral is not None)
    assert calls.referral is not None
    calls.referral.set_result(TransferOutcome(status="accepted", sip_status=200))
    await _until(lambda: transfer.state is WarmState.ENDED)
    assert (caller.end_reason, human.end_reason) == ("transferred", "transferred")
    assert (transfer.handoff, transfer.outcome) == ("refer", "transferred") and transfer.over.is_set()
    assert [kind for kind, _, _ in calls.reports] == ["call.transfer_started", "call.transferred"]


CONVERSE = REQUEST.model_copy(update={"briefing": "conversation"})


async def _conversing(
    calls: FakeCalls, warm: WarmTransfers, caller: CallLeg, request: WarmTransferRequest = CONVERSE
) -> tuple[Any, CallLeg, FakeSession]:
    """A conversational briefing under way: the human answered, their session spoke and is idle."""
    transfer = await warm.start(caller, request, initiator="agent")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    briefing = FakeSession(frames_out=40, agent_idle=True)
    human.session = cast(CallSession, briefing)
    await _until(lambda: transfer.state is WarmState.BRIEFING)
    return transfer, human, briefing


async def test_a_conversation_gives_the_human_the_agent_who_connects_the_caller() -> None:
    calls, warm, caller, session = _setup()
    transfer, human, briefing = await _conversing(calls, warm, caller)
    ((_, admission),) = calls.originated
    assert admission.profile is not None and "Wants the annual plan." in admission.profile.instructions
    assert [tool.name for tool in admission.profile.tools] == ["connect_caller", "decline_transfer"]
    assert human.bridge is None and calls.routes[human.id].bridge is None, "the human's audio goes to the agent"
    await asyncio.sleep(5 * warm_module._POLL_S)  # a spoken briefing would have joined by now (idle, spoke)
    assert transfer.state is WarmState.BRIEFING and session.held == "gateway"
    assert await SipCallControl(caller).end_briefing(connect=True) == "this call is not a warm transfer's briefing"
    assert await SipCallControl(human).end_briefing(connect=True) == ""
    await _until(lambda: transfer.state is WarmState.BRIDGED)
    await _until(lambda: session.closed and briefing.closed)
    assert transfer.briefed and transfer.join_by == "agent" and human.bridge is transfer.bridge
    for leg in (caller, human):
        assert calls.routes[leg.id].bridge is transfer.bridge and calls.routes[leg.id].session is None
    assert "not briefing" in await SipCallControl(human).end_briefing(connect=False, reason="late")
    line = calls.reports[-1][2]
    assert calls.reports[-1][0] == "call.transferred" and line["briefing"] == "conversation"


async def test_a_declined_transfer_gives_the_caller_back_to_the_agent_told_why() -> None:
    calls, warm, caller, session = _setup()
    transfer, human, _ = await _conversing(calls, warm, caller)
    assert await SipCallControl(human).end_briefing(connect=False, reason="I'm off shift in a minute") == ""
    await _until(lambda: transfer.state is WarmState.FAILED)
    assert (transfer.outcome, human.end_reason) == ("declined", "transfer_declined")
    assert session.held is None and not transfer.bridge.joined and caller.bridge is None
    ((note, respond),) = session.notes
    assert respond and "did not go through (the colleague declined the call: I'm off shift in a minute)" in note
    kind, _, line = calls.reports[-1]
    assert (kind, line["outcome"], line["declined_reason"]) == (
        "call.transfer_failed",
        "declined",
        "I'm off shift in a minute",
    )
    assert warm.outcomes == {"declined": 1}


async def test_a_human_hanging_up_mid_conversation_brings_the_caller_back() -> None:
    calls, warm, caller, session = _setup()
    transfer, human, _ = await _conversing(calls, warm, caller)
    calls.end(human, "peer_hangup")
    await _until(lambda: transfer.state is WarmState.FAILED)
    assert transfer.outcome == "human_hangup" and transfer.declined_reason is None
    assert session.held is None and "hung up before the caller was connected" in session.notes[0][0]


async def test_a_conversation_that_never_ends_joins_them_at_its_timeout() -> None:
    calls, warm, caller, _ = _setup(warm_transfer_conversation_timeout_s=0.1, warm_transfer_brief_timeout_s=300)
    transfer, human, _ = await _conversing(calls, warm, caller)
    await _until(lambda: transfer.state is WarmState.BRIDGED)  # after the 0.1 s of the conversation's timeout
    assert transfer.briefed and transfer.join_by == "" and human.bridge is transfer.bridge


async def test_the_ops_api_forces_the_join_of_a_transfer_in_briefing_only() -> None:
    calls, warm, caller, _ = _setup()
    with pytest.raises(CommandRejectedError, match="has no warm transfer"):
        warm.force_join(caller)
    transfer = await warm.start(caller, CONVERSE, initiator="api")
    with pytest.raises(CommandRejectedError, match="is dialling, not briefing"):
        warm.force_join(caller)
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    await _until(lambda: transfer.state is WarmState.BRIEFING)
    assert warm.force_join(human) is transfer  # the human's leg names it as well as the caller's
    with pytest.raises(CommandRejectedError, match="asked already"):
        warm.force_join(caller)
    await _until(lambda: transfer.state is WarmState.BRIDGED)
    assert transfer.join_by == "api" and not transfer.briefed, "joined before the agent said anything"
    with pytest.raises(CommandRejectedError, match="is bridged, not briefing"):
        warm.force_join(caller)
    # A spoken briefing may be cut short the same way.
    calls, warm, caller, _ = _setup()
    transfer = await warm.start(caller, REQUEST, initiator="api")
    human = calls.legs[transfer.human_id]
    calls.answer(human)
    human.session = cast(CallSession, FakeSession(frames_out=10))  # still speaking
    await _until(lambda: transfer.state is WarmState.BRIEFING)
    warm.force_join(caller)
    await _until(lambda: transfer.state is WarmState.BRIDGED)


# ------------------------------------------------------------------------------ a real worker, in one loop


async def test_a_worker_bridges_caller_and_human_and_each_hears_the_other() -> None:
    """SIP, RTP and the tick for real (the echo agent): the caller's audio reaches the human and the other way
    round, through the bridge, as G.711 codes; the human's BYE ends the caller's leg."""
    from gateway.sip.events import CallEnded, CallOffered
    from tests.gateway.worker.sip_peer import SipPeer, echo_worker
    from tests.gateway.worker.test_worker import _answered, best_correlation, speechlike

    async with (
        echo_worker(worker_id="w-warm", rtp_timeout_s=5.0, warm_transfer_brief_timeout_s=0.3) as worker,
        SipPeer() as caller_phone,
        SipPeer() as human_phone,
    ):
        call = caller_phone.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
        await _answered(caller_phone, call)
        (caller,) = worker.legs.values()
        target = f"sip:human@127.0.0.1:{human_phone.port}"
        line = await worker.warm_transfer(caller.id, WarmTransferRequest(target=target, summary="A test call."))
        offered = await human_phone.wait_for(CallOffered)
        human_call = human_phone.answer(offered)  # type: ignore[arg-type]
        assert isinstance(caller, CallLeg) and caller.warm is not None
        transfer = caller.warm
        await _until(lambda: transfer.state is WarmState.BRIDGED)  # the echo agent says nothing: the timeout
        from_caller, from_human = speechlike(1.5, seed=3), speechlike(1.5, seed=4)
        await asyncio.gather(caller_phone.stream(call, from_caller), human_phone.stream(human_call, from_human))
        await asyncio.gather(
            caller_phone.stream(call, np.zeros(8000, np.int16), frames=10),
            human_phone.stream(human_call, np.zeros(8000, np.int16), frames=10),
        )
        assert best_correlation(from_caller, human_phone.heard(human_call)) > 0.95
        assert best_correlation(from_human, caller_phone.heard(call)) > 0.95
        assert transfer.bridge.frames >= 2 * 75
        human_phone.hang_up(human_call)
        await caller_phone.wait_for(CallEnded, call=call.handle)
        await _until(lambda: not worker.legs)
        assert caller.end_reason == "human_hangup" and transfer.state is WarmState.ENDED
        assert line.human_leg == transfer.human_id and worker.routes == {}


async def _bridged_phones(worker: Any, caller_phone: Any, human_phone: Any, **invite: Any) -> tuple[Any, Any, Any]:
    """A caller's call warm transferred to the human phone, who answers: the two calls and the transfer, joined."""
    from gateway.sip.events import CallOffered
    from tests.gateway.worker.test_worker import _answered

    call = caller_phone.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",), **invite)
    await _answered(caller_phone, call)
    (caller,) = worker.legs.values()
    target = f"sip:human@127.0.0.1:{human_phone.port}"
    await worker.warm_transfer(caller.id, WarmTransferRequest(target=target, summary="A test call."))
    human_call = human_phone.answer(await human_phone.wait_for(CallOffered))
    assert isinstance(caller, CallLeg) and caller.warm is not None
    transfer = caller.warm
    await _until(lambda: transfer.state is WarmState.BRIDGED)
    return call, human_call, transfer


def _press(phone: Any, call: Any, digit: str) -> None:
    phone.endpoint.send_dtmf_info(call.handle, phone.transport.now(), digit=digit)
    phone.transport.pump()


def _events(call: Any) -> list[int]:
    """The RFC 4733 events (0-9 digits, 10 star, 11 pound) the phone received, one per event."""
    codes = [payload[0] for pt, payload in zip(call.received_pts, call.received, strict=True) if pt == 101]
    return [code for i, code in enumerate(codes) if i == 0 or codes[i - 1] != code]


async def test_digits_cross_the_bridge_each_way_as_the_other_leg_takes_them() -> None:
    """Once joined, a digit the caller sends as SIP INFO reaches the human as RFC 4733 events (their answer took
    telephone-event), and the human's the caller: the agent that took digits has left the call."""
    from tests.gateway.worker.sip_peer import SipPeer, echo_worker

    async with (
        echo_worker(worker_id="w-warm-dtmf", rtp_timeout_s=5.0, warm_transfer_brief_timeout_s=0.3) as worker,
        SipPeer() as caller_phone,
        SipPeer() as human_phone,
    ):
        call, human_call, transfer = await _bridged_phones(worker, caller_phone, human_phone)
        _press(caller_phone, call, "5")
        _press(human_phone, human_call, "#")
        await _until(lambda: _events(human_call) == [5] and _events(call) == [11])
        assert transfer.bridge.digits == 2


async def test_a_digit_reaches_a_leg_without_telephone_event_or_info_as_tones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller negotiated no telephone-event and allows no INFO: the human's digit is played to them as
    tones in place of the human's audio for its length (and no RFC 4733 packet is sent)."""
    from gateway.sip import core
    from telcodecs.dtmf import GoertzelDetector
    from tests.gateway.worker.sip_peer import SipPeer, echo_worker

    async with (
        echo_worker(worker_id="w-warm-tones", rtp_timeout_s=5.0, warm_transfer_brief_timeout_s=0.3) as worker,
        SipPeer() as caller_phone,
        SipPeer() as human_phone,
    ):
        with monkeypatch.context() as m:
            m.setattr(core, "ALLOWED_METHODS", tuple(x for x in core.ALLOWED_METHODS if x != "INFO"))
            call, human_call, transfer = await _bridged_phones(worker, caller_phone, human_phone, telephone_event=False)
        _press(human_phone, human_call, "7")
        await _until(lambda: transfer.bridge.digits == 1)
        await caller_phone.stream(call, np.zeros(8000, np.int16), frames=25)  # half a second of ticks to hear them
        assert [press.digit for press in GoertzelDetector(8000).feed(caller_phone.heard(call))] == ["7"]
        assert 101 not in call.received_pts


async def _joined_with_refer(worker: Any, caller_phone: Any, human_phone: Any) -> tuple[Any, Any, CallLeg, Any]:
    """A caller's call, warm transferred with ``handoff="refer"`` to the human phone, who answers: until joined."""
    from gateway.sip.events import CallOffered
    from tests.gateway.worker.test_worker import _answered

    call = caller_phone.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
    await _answered(caller_phone, call)
    (caller,) = worker.legs.values()
    request = WarmTransferRequest(target=f"sip:human@127.0.0.1:{human_phone.port}", summary="A test.", handoff="refer")
    await worker.warm_transfer(caller.id, request)
    offered = await human_phone.wait_for(CallOffered)
    human_call = human_phone.answer(offered)
    assert isinstance(caller, CallLeg) and caller.warm is not None
    await _until(lambda: caller.warm is not None and caller.warm.state is WarmState.BRIDGED)
    return call, human_call, caller, caller.warm


async def test_a_referred_caller_reaches_the_human_and_the_gateway_leaves() -> None:
    """The caller's phone takes the REFER (its Refer-To replaces the human's dialog with the gateway) and NOTIFYs
    200: both of the gateway's legs end, the human's phone having BYEd the replaced dialog as a phone does."""
    from gateway.sip.events import CallEnded, ReferReceived
    from tests.gateway.worker.sip_peer import SipPeer, echo_worker

    async with (
        echo_worker(worker_id="w-warm-refer", rtp_timeout_s=5.0, warm_transfer_brief_timeout_s=0.3) as worker,
        SipPeer() as caller_phone,
        SipPeer() as human_phone,
    ):
        call, human_call, caller, transfer = await _joined_with_refer(worker, caller_phone, human_phone)
        refer = await caller_phone.wait_for(ReferReceived, call=call.handle)
        assert isinstance(refer, ReferReceived)
        dialog = human_phone.endpoint._core.calls[human_call.handle].dialog  # the human's side of its dialog
        # RFC 3891 §3: to-tag is the tag of the phone that gets the INVITE with Replaces, from-tag the gateway's.
        assert refer.replaces == f"{dialog.call_id};to-tag={dialog.local_tag};from-tag={dialog.remote_tag}"
        assert refer.refer_to.endswith(f"@127.0.0.1:{human_phone.port}"), "the human phone's Contact"
        assert refer.referred_by is not None and transfer.state is WarmState.BRIDGED, "bridged meanwhile"
        now = caller_phone.transport.now
        caller_phone.endpoint.accept_refer(call.handle, now())
        caller_phone.transport.pump()
        human_phone.hang_up(human_call)  # the INVITE with Replaces took the dialog over
        caller_phone.endpoint.notify_refer(call.handle, now(), status=200, reason="OK")
        caller_phone.transport.pump()
        await caller_phone.wait_for(CallEnded, call=call.handle)
        await _until(lambda: not worker.legs)
        assert (transfer.handoff, transfer.outcome, transfer.state) == ("refer", "transferred", WarmState.ENDED)
        assert caller.end_reason == "transferred" and worker.routes == {}
        assert transfer.line().handoff == "refer" and transfer.handoff_detail == ""


async def test_a_refused_refer_keeps_the_bridge() -> None:
    """The caller's phone declines the REFER: caller and human go on hearing each other through the gateway."""
    from gateway.sip.events import CallEnded, ReferReceived
    from tests.gateway.worker.sip_peer import SipPeer, echo_worker
    from tests.gateway.worker.test_worker import best_correlation, speechlike

    async with (
        echo_worker(worker_id="w-warm-refused", rtp_timeout_s=5.0, warm_transfer_brief_timeout_s=0.3) as worker,
        SipPeer() as caller_phone,
        SipPeer() as human_phone,
    ):
        call, human_call, caller, transfer = await _joined_with_refer(worker, caller_phone, human_phone)
        await caller_phone.wait_for(ReferReceived, call=call.handle)
        caller_phone.endpoint.decline_refer(call.handle, caller_phone.transport.now(), status=603, reason="Decline")
        caller_phone.transport.pump()
        await _until(lambda: transfer.handoff_detail != "")
        assert transfer.handoff_detail == "REFER refused 603: Decline" and transfer.handoff == "bridge"
        assert transfer.state is WarmState.BRIDGED and caller.live
        from_caller, from_human = speechlike(1.0, seed=5), speechlike(1.0, seed=6)
        await asyncio.gather(caller_phone.stream(call, from_caller), human_phone.stream(human_call, from_human))
        await asyncio.gather(
            caller_phone.stream(call, np.zeros(8000, np.int16), frames=10),
            human_phone.stream(human_call, np.zeros(8000, np.int16), frames=10),
        )
        assert best_correlation(from_caller, human_phone.heard(human_call)) > 0.95
        assert best_correlation(from_human, caller_phone.heard(call)) > 0.95
        caller_phone.hang_up(call)
        await human_phone.wait_for(CallEnded, call=human_call.handle)
        await _until(lambda: not worker.legs)
        assert transfer.outcome == "caller_hangup" and transfer.line().handoff_detail.startswith("REFER refused")
