"""Warm (attended) transfer to a human: dial them, brief them, join them with the caller, leave (ADR 0041).

``POST /v1/calls/{id}/warm_transfer`` and the agent's ``warm_transfer`` tool come here. A transfer:

1. puts the caller on the gateway's hold (the session's hold audio, no re-INVITE: the caller's phone keeps
   sendrecv, so the join needs no signalling) or leaves them with the agent (``caller_hears="agent"``), and
   places the human's leg through the worker's originate path (the trunk for bare numbers);
2. once the human answers, a session of its own on the human's leg (the caller's provider, briefing
   instructions, the summary as its greeting) speaks the summary to the human. The human's audio goes to the
   bridge from their answer on, never to that session, so the briefing runs as one uninterrupted turn; the caller
   hears none of it (their leg is not joined yet). In a conversational briefing (``briefing="conversation"``) the
   human's audio goes to that session instead (its route takes the bridge only at the join), whose instructions
   carry the summary and whose tools ``connect_caller`` and ``decline_transfer`` end the briefing;
3. when the briefing has been played out (or after ``warm_transfer_brief_timeout_s``; in a conversation: on
   ``connect_caller``, or after ``warm_transfer_conversation_timeout_s``; or on the ops API's forced join), the
   bridge is joined
   (gateway/worker/bridge.py: each leg's frames to the other's encoder in the tick) and both sessions close:
   the agent leaves the media path and its provider connection;
4. either side hanging up ends the other with a BYE. The caller's recording, if any, goes on across the bridge.
5. when the handoff is ``refer`` (the request's ``handoff``, else ``warm_transfer_refer``: auto when the caller's
   INVITE offered REFER and Replaces), the caller is REFERred to the human's Contact with a Replaces of the
   gateway-human dialog (gateway/sip/replaces.py) while the bridge goes on; on the 2xx NOTIFY the caller has
   reached the human directly and both of the gateway's legs end (``handoff: refer``); a refused or failed REFER
   keeps the bridge (``handoff_detail`` says why).

When the human does not answer in time, is busy or declines (their phone, or ``decline_transfer``), or hangs up
during the briefing, their leg is cleaned up by the originate path, the caller comes off hold and the agent is told
with a system note that asks for a response (so it says so). The transfer's steps are a table (:data:`TRANSITIONS`),
driven by :meth:`step`.
Events: ``call.transfer_started``, then ``call.transferred`` or ``call.transfer_failed``, on the caller's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import (
    AdmissionDecision,
    OriginateRequest,
    ProfileModel,
    ToolModel,
    WarmTransferRequest,
    WorkerEventType,
)
from gateway.observability import WARM_TRANSFERS_TOTAL
from gateway.session.errors import SessionStateError
from gateway.session.state import CallState
from gateway.session.transcript import TranscriptEntry
from gateway.worker.bridge import Bridge
from gateway.worker.legs import LegState
from gateway.worker.reporting import user_part
from gateway.worker.transfer import Briefing, Initiator, WarmState, WarmTransfer, WarmTransferError, wants_refer

if TYPE_CHECKING:
    from gateway.session.control import TransferOutcome
    from gateway.worker.routes import TickRoute
    from gateway.worker.sip_leg import CallLeg
    from gateway.worker.slices import WarmTransferSettings

log = logging.getLogger(__name__)

_POLL_S = 0.02  # one tick: how often the briefing is looked at while it plays
#: After the human's phone ended its dialog with us during a REFER handoff (it does once the caller's INVITE with
#: Replaces took it over), how long the caller's NOTIFY may take before the human counts as having hung up.
HANDOFF_GRACE_S = 5.0
NO_REPLACES = "the caller's INVITE did not offer REFER and Replaces"


BRIEF_INSTRUCTIONS = (
    "You are a voice agent handing a phone call over to a human colleague, who has just answered. The caller "
    "cannot hear you. Give the colleague the briefing you are asked to give, in one short turn, then stop. "
    "Do not call any tools."
)
CONVERSE_INSTRUCTIONS = (
    "You are a voice agent handing a phone call over to a human colleague, who has just answered. The caller "
    "is waiting on hold and cannot hear you or the colleague. What you know about the call: {summary}\n"
    "Brief the colleague and answer their questions about the call from what you know; do not invent facts. "
    "When they are ready to take the call, say so in a few words and call connect_caller. If they will not or "
    "cannot take it, call decline_transfer with their reason: the caller then goes back to the agent they were "
    "talking with."
)
FAILED_NOTE = (
    "The transfer to {target} did not go through ({why}). The caller is back with you and can hear you again: "
    "tell them, and offer what else you can do."
)
_WHY = {
    "no_answer": "nobody answered",
    "sip_486": "the line was busy",
    "sip_600": "the line was busy",
    "sip_603": "the call was declined",
    "sip_480": "nobody is available",
    "human_hangup": "the colleague hung up before the caller was connected",
    "declined": "the colleague declined the call",
}


def why(outcome: str) -> str:
    """The failure, as the agent is told it."""
    return _WHY.get(outcome, f"it failed: {outcome}")


def summary_of(transcript: Iterable[TranscriptEntry], *, lines: int = 8) -> str:
    """A summary for the human when none was given: the last ``lines`` said, caller and agent."""
    said = [
        f"{'The caller' if e.role == 'user' else 'I'} said: {e.text.strip()}"
        for e in transcript
        if e.kind == "message" and e.role in ("user", "assistant") and e.text.strip()
    ]
    if not said:
        return "A caller is waiting to be connected to you."
    return "Here is the call so far. " + " ".join(said[-lines:])


def briefing_profile(profile: ProfileModel, summary: str, briefing: Briefing = "spoken") -> ProfileModel:
    """The human leg's agent: the caller's provider and voice, briefing instructions, the summary as greeting;
    in a conversation, instructions that carry the summary and the tools to connect the caller or decline."""
    if briefing == "conversation":
        instructions = CONVERSE_INSTRUCTIONS.format(summary=summary)
        greeting = f"I have a caller for you. {summary} Shall I connect them?"
        tools = [ToolModel(name="connect_caller"), ToolModel(name="decline_transfer")]
    else:
        instructions = BRIEF_INSTRUCTIONS
        greeting = f"I have a caller for you. {summary} I am connecting you now."
        tools = []
    return profile.model_copy(
        update={
            "name": f"{profile.name}-briefing",
            "instructions": instructions,
            "greeting": greeting,
            "tools": tools,
            "record": "off",
            "record_notice": "",
            "handoffs": [],
            "handoff_profiles": {},
            "guardrails": [],
            "no_input_prompt_s": 0.0,
            "no_input_hangup_s": 0.0,
        }
    )


class WarmHost(Protocol):
    """What a transfer needs of the worker's SIP calls (``SipCalls``)."""

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str: ...

    def end(self, leg: CallLeg, reason: str) -> None: ...

    def sip_leg(self, call_id: str) -> CallLeg | None: ...

    def route_of(self, call_id: str) -> TickRoute | None: ...

    def report_transfer(self, kind: WorkerEventType, leg: CallLeg, data: dict[str, object]) -> None: ...

    def spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...

    async def refer_replacing(self, caller: CallLeg, human: CallLeg) -> TransferOutcome: ...


class WarmTransfers:
    """The warm transfers of one worker's SIP calls."""

    def __init__(self, host: WarmHost, settings: WarmTransferSettings, *, worker_id: str = "") -> None:
        self._host = host
        self._worker_id = worker_id
        self._settings = settings
        self._queues = settings.queues()
        self.started = 0
        self.outcomes: dict[str, int] = {}  # transferred / failed / ended, ever

    async def start(self, caller: CallLeg, request: WarmTransferRequest, *, initiator: Initiator) -> WarmTransfer:
        """Put the caller on hold, dial the human; returns once their phone is being called. CommandRejectedError
        (409) naming why when this call cannot be transferred now, or the target cannot be dialled."""
        session = caller.session
        if session is None or caller.state is not LegState.ACTIVE or session.state is not CallState.ACTIVE:
            raise CommandRejectedError(f"call {caller.id}: its agent is not up ({caller.state.value})")
        previous = caller.warm
        if previous is not None and previous.human_id == caller.id:
            raise CommandRejectedError(f"call {caller.id} is the human leg of warm transfer {previous.id}")
        if previous is not None and previous.live:
            raise CommandRejectedError(f"call {caller.id}: warm transfer {previous.id} is {previous.state.value}")
        if session.held is not None:
            raise CommandRejectedError(f"call {caller.id} is on hold (by the {session.held})")
        target = self._queues.get(request.target, request.target)
        summary = request.summary.strip() or summary_of(session.transcript)
        profile = caller.profile
        if profile is None:
            raise CommandRejectedError(f"call {caller.id} has no agent profile")
        human_id = f"c-{secrets.token_hex(6)}"
        transfer = WarmTransfer(
            id=f"wt-{secrets.token_hex(4)}",
            target=target,
            caller_id=caller.id,
            human_id=human_id,
            summary=summary,
            initiator=initiator,
            caller_hears=request.caller_hears,
            briefing=request.briefing or self._settings.warm_transfer_briefing,
            bridge=Bridge(caller.id, human_id),
        )
        setting = self._settings.warm_transfer_refer
        transfer.refer = wants_refer(request.handoff, setting, caller_offers=caller.refer_replaces)
        if request.handoff is None and setting == "auto" and not transfer.refer:
            transfer.handoff_detail = NO_REPLACES
        ring_s = request.ring_timeout_s or self._settings.warm_transfer_ring_timeout_s
        caller_number = user_part(caller.from_uri) or "gateway"
        # A number goes through the trunk of the caller's route (the same carrier), a SIP URI as it is.
        trunk = caller.trunk if not target.startswith(("sip:", "sips:", "tel:")) else None
        origin = OriginateRequest(
            to=target, caller_id=caller_number, route=caller.route, trunk=trunk, ring_timeout_s=ring_s
        )
        admission = AdmissionDecision(
            accepted=True,
            call_id=human_id,
            route=caller.route,
            profile=briefing_profile(profile, summary, transfer.briefing),
        )
        await self._host.originate(origin, admission)  # CommandRejectedError: a number and no trunk, a bad URI
        human = self._host.sip_leg(human_id)
        if human is None:  # failed at once (it ended before we got it back)
            raise CommandRejectedError(f"call {caller.id}: the call to {target!r} could not be placed")
        # Before anything can answer: the human's route takes the bridge when its media starts (its audio then goes
        # nowhere until the join); in a conversation the route gets it at the join, the human talks with the agent.
        human.warm = transfer
        if transfer.briefing == "spoken":
            human.bridge = transfer.bridge
        caller.warm = transfer
        if transfer.caller_hears == "hold":
            session.set_held(True, by="gateway")
        self.started += 1
        log.info(
            "call %s: warm transfer %s to %s (%s, %s briefing), the human's leg %s, summary of %d characters",
            caller.id,
            transfer.id,
            target,
            initiator,
            transfer.briefing,
            human_id,
            len(summary),
        )
        self._report("call.transfer_started", caller, transfer)
        transfer.task = self._host.spawn_task(self._run(transfer, caller, human), f"call-{caller.id}-warm")
        return transfer

    async def _run(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        try:
            await self._dial(transfer, caller, human)
            if transfer.state is WarmState.BRIEFING:
                await self._brief(transfer, caller, human)
            if transfer.state is WarmState.BRIDGED and transfer.refer:
                await self._hand_off(transfer, caller, human)
            if transfer.state is WarmState.BRIDGED:
                await self._bridged(transfer, caller, human)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("call %s: warm transfer %s failed", caller.id, transfer.id)
            if transfer.state is WarmState.BRIDGED:
                self._host.end(caller, "internal_error")
                self._host.end(human, "internal_error")
            elif transfer.live:
                self._host.end(human, "internal_error")
                self._failed(transfer, caller, "internal_error")
        finally:
            transfer.over.set()  # the legs' tasks waiting on the bridge go on

    async def _dial(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        answered = human.answered
        assert answered is not None
        await _first(answered, transfer.caller_gone, transfer.human_gone)
        if transfer.caller_gone.is_set():
            self._caller_left(transfer, human)
            return
        if not answered.done() or not answered.result() or transfer.human_gone.is_set():
            transfer.fire("unanswered")
            self._failed(transfer, caller, human.end_reason or "not_answered")
            return
        transfer.fire("answered")
        transfer.answered = time.time()
        log.info("call %s: warm transfer %s: %s answered; briefing", caller.id, transfer.id, transfer.target)

    def _caller_left(self, transfer: WarmTransfer, human: CallLeg) -> None:
        """The caller hung up before the join: the human's leg has nobody to meet, and ends."""
        transfer.fire("caller_gone")
        transfer.outcome = "caller_hangup"
        self._host.end(human, "caller_hangup")
        self._count("ended")

    async def _brief(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        loop = asyncio.get_running_loop()
        conversation = transfer.briefing == "conversation"
        settings = self._settings
        timeout_s = (
            settings.warm_transfer_conversation_timeout_s if conversation else settings.warm_transfer_brief_timeout_s
        )
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if transfer.caller_gone.is_set() or transfer.human_gone.is_set() or transfer.asked.is_set():
                break
            session = human.session
            if session is not None:
                if session.state is CallState.ENDING or session.state is CallState.ENDED:
                    break  # the briefing session failed or ended: join them unbriefed
                if not conversation and session.state is CallState.ACTIVE and self._spoke(human) and session.agent_idle:
                    transfer.briefed = True
                    break
            # Woken at once by a leg ending or a join asked; else the briefing is looked at again next tick.
            await _first(transfer.caller_gone, transfer.human_gone, transfer.asked, within_s=_POLL_S)
        if transfer.caller_gone.is_set():
            self._caller_left(transfer, human)
            return
        if transfer.declined_reason is not None:  # before human_gone: the decline ends the human's leg itself
            transfer.fire("declined")
            self._host.end(human, "transfer_declined")
            self._failed(transfer, caller, "declined")
            return
        if transfer.human_gone.is_set():
            transfer.fire("human_gone")
            self._failed(transfer, caller, "human_hangup")
            return
        if conversation:
            transfer.briefed = self._spoke(human)  # the greeting (the summary) was said at least in part
        if transfer.asked.is_set():
            transfer.fire("connected")
            log.info("call %s: warm transfer %s: joined by the %s", caller.id, transfer.id, transfer.join_by)
        else:
            transfer.fire("briefed")
        self._join(transfer, caller, human)

    @staticmethod
    def _spoke(human: CallLeg) -> bool:
        session = human.session
        return session is not None and session.stats().frames_out > 0

    def force_join(self, leg: CallLeg) -> WarmTransfer:
        """POST /v1/calls/{id}/warm_transfer/join (``leg`` the caller's or the human's): join the two now instead
        of waiting for the briefing. CommandRejectedError (409) when the leg has no transfer in briefing."""
        transfer = leg.warm
        if transfer is None:
            raise CommandRejectedError(f"call {leg.id} has no warm transfer")
        try:
            transfer.ask_join("api")
        except WarmTransferError as exc:
            raise CommandRejectedError(f"call {leg.id}: {exc}") from exc
        return transfer

    def _join(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        bridge = transfer.bridge
        # Before the sessions close: the legs' tasks then wait for the bridge to end (the human's leg has it from
        # its answer on in a spoken briefing; in a conversation its audio went to the briefing session until now).
        caller.bridge = human.bridge = bridge
        for leg in (caller, human):
            route = self._host.route_of(leg.id)
            if route is not None:
                route.bridge = bridge
                route.session = None
        bridge.joined = True
        transfer.bridged = time.time()
        if caller.session is not None and caller.session.held == "gateway":
            caller.session.set_held(False, by="gateway")
        for leg, reason in ((caller, "transferred"), (human, "briefed")):
            leg.cost -= leg.agent_cost  # no agent on the leg any more: it takes what its media takes
            leg.agent_cost = 0.0
            if leg.session is not None:
                self._host.spawn_task(leg.session.aclose(reason), f"call-{leg.id}-warm-close")
        log.info(
            "call %s: warm transfer %s: bridged with %s (briefed=%s); the agent left the call",
            caller.id,
            transfer.id,
            human.id,
            transfer.briefed,
        )
        self._count("transferred")
        self._report("call.transferred", caller, transfer)

    async def _hand_off(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        """REFER the caller to the human with Replaces while the bridge goes on; on success both legs end."""
        referral = asyncio.ensure_future(self._host.refer_replacing(caller, human))
        try:
            await _first(referral, transfer.caller_gone, transfer.human_gone)
            if transfer.human_gone.is_set() and not transfer.caller_gone.is_set():
                # The human's phone BYEs the replaced dialog, often before the caller's NOTIFY reaches us.
                await _first(referral, transfer.caller_gone, within_s=HANDOFF_GRACE_S)
        finally:
            pending = not referral.done()
            if pending:
                referral.cancel()  # a Task is cancelled at its next step, not here
        if pending or referral.cancelled():
            transfer.handoff_detail = "REFER: a leg ended before its outcome"
            return
        outcome = referral.result()
        if outcome.status != "accepted":
            sip = f" {outcome.sip_status}" if outcome.sip_status else ""
            transfer.handoff_detail = f"REFER {outcome.status}{sip}: {outcome.detail}".strip()[:200]
            log.info("call %s: warm transfer %s: %s; still bridged", caller.id, transfer.id, transfer.handoff_detail)
            return
        transfer.handoff = "refer"
        transfer.outcome = "transferred"
        transfer.fire("handed_off")
        for leg in (caller, human):  # a BYE for whichever dialog its peer has not ended already
            self._host.end(leg, "transferred")
        log.info(
            "call %s: warm transfer %s: handed off to %s with REFER/Replaces after %d bridged frames",
            caller.id,
            transfer.id,
            human.id,
            transfer.bridge.frames,
        )

    async def _bridged(self, transfer: WarmTransfer, caller: CallLeg, human: CallLeg) -> None:
        await _first(transfer.caller_gone, transfer.human_gone)
        if transfer.caller_gone.is_set():
            transfer.fire("caller_gone")
            transfer.outcome = "caller_hangup"
            self._host.end(human, "peer_hangup")
        else:
            transfer.fire("human_gone")
            transfer.outcome = "human_hangup"
            self._host.end(caller, "human_hangup")
        log.info(
            "call %s: warm transfer %s: bridge over after %d frames and %d digits (%s)",
            caller.id,
            transfer.id,
            transfer.bridge.frames,
            transfer.bridge.digits,
            transfer.outcome,
        )

    def _failed(self, transfer: WarmTransfer, caller: CallLeg, outcome: str) -> None:
        """The human was not reached: the caller is back with the agent, who is told."""
        transfer.outcome = outcome
        self._count("declined" if outcome == "declined" else "failed")
        log.info("call %s: warm transfer %s to %s failed: %s", caller.id, transfer.id, transfer.target, outcome)
        session = caller.session
        if caller.live and session is not None:
            if session.held == "gateway":
                session.set_held(False, by="gateway")
            with contextlib.suppress(SessionStateError):
                reason = why(outcome)
                if transfer.declined_reason:
                    reason = f"{reason}: {transfer.declined_reason}"
                session.inject(FAILED_NOTE.format(target=transfer.target, why=reason), role="system", respond=True)
        self._report("call.transfer_failed", caller, transfer)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        WARM_TRANSFERS_TOTAL.labels(self._worker_id, outcome).inc()

    def _report(self, kind: WorkerEventType, caller: CallLeg, transfer: WarmTransfer) -> None:
        self._host.report_transfer(kind, caller, transfer.line().model_dump(mode="json"))


async def _first(*signals: asyncio.Future[Any] | asyncio.Event, within_s: float | None = None) -> None:
    """Until the first of ``signals`` is done or set (or ``within_s`` seconds)."""
    waits: list[asyncio.Future[object]] = []
    for signal in signals:
        if isinstance(signal, asyncio.Event):
            if signal.is_set():
                return
            waits.append(asyncio.ensure_future(signal.wait()))
        else:
            if signal.done():
                return
            waits.append(asyncio.shield(signal))
    try:
        await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
