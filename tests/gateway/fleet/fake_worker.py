"""A fake media worker: implements WorkerCommands, drives a ControlLink, records every command it got.

It holds calls as CallSnapshots the test shapes directly (no SIP, no media), reports them through the
link exactly as a real worker would, and answers hang-up by ending the call and reporting call.ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.fleet import (
    AdmissionDecision,
    AdmissionRequest,
    CallNotFoundError,
    CallSnapshot,
    CommandRejectedError,
    ControlLink,
    OriginateRequest,
    TrunkRegistration,
    WorkerEvent,
    WorkerInfo,
)
from gateway.fleet.models import AgentCommand, TransferLine, WarmTransferRequest


class FakeWorker:
    def __init__(
        self,
        worker_id: str = "worker-a",
        *,
        capacity: int = 10,
        url: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.worker_id = worker_id
        self.capacity = capacity
        self.url = url
        self.clock = clock
        self.link: ControlLink | None = None
        self.calls: dict[str, CallSnapshot] = {}
        self.draining = False
        self.exit_when_empty = False
        self.hangups: list[tuple[str, str]] = []
        self.transfers: list[tuple[str, str]] = []
        self.warm_transfers: list[tuple[str, WarmTransferRequest]] = []
        self.warm_joins: list[str] = []
        self.holds: list[tuple[str, bool]] = []
        self.dtmf: list[tuple[str, str]] = []
        self.agent_commands: list[tuple[str, AgentCommand]] = []
        self.originated: list[tuple[OriginateRequest, AdmissionDecision]] = []
        self.drains: list[bool] = []
        self.registration: TrunkRegistration | None = None  # what it reports of its trunk registration
        self.registrations: list[TrunkRegistration] = []  # and of each trunk's
        self.drain_deadlines: list[float | None] = []
        self.hung_up = asyncio.Event()

    # ------------------------------------------------------------------------ WorkerCommands
    def _live(self, call_id: str) -> CallSnapshot:
        call = self.calls.get(call_id)
        if call is None or call.state == "ended":
            raise CallNotFoundError(call_id)
        return call

    async def hang_up(self, call_id: str, reason: str) -> None:
        self._live(call_id)
        self.hangups.append((call_id, reason))
        self.hung_up.set()
        await self.end_call(call_id, reason=f"hangup:{reason}")

    async def hold(self, call_id: str, held: bool) -> None:
        call = self._live(call_id)
        if call.state != ("active" if held else "held"):
            raise CommandRejectedError(f"call {call_id} is {call.state}")
        self.holds.append((call_id, held))

    async def transfer(self, call_id: str, target: str) -> None:
        call = self._live(call_id)
        if call.state != "active":
            raise CommandRejectedError(f"call {call_id} is {call.state}, not active")
        self.transfers.append((call_id, target))

    async def warm_transfer(self, call_id: str, request: WarmTransferRequest) -> TransferLine:
        call = self._live(call_id)
        if call.state != "active":
            raise CommandRejectedError(f"call {call_id} is {call.state}, not active")
        self.warm_transfers.append((call_id, request))
        return TransferLine(
            id="wt-1",
            target=request.target,
            caller_leg=call_id,
            human_leg="c-human",
            state="dialling",
            initiator="api",
            started=time.time(),
        )

    async def warm_transfer_join(self, call_id: str) -> TransferLine:
        self._live(call_id)
        if not any(leg == call_id for leg, _ in self.warm_transfers):
            raise CommandRejectedError(f"call {call_id} has no warm transfer")
        self.warm_joins.append(call_id)
        return TransferLine(
            id="wt-1",
            target="sales",
            caller_leg=call_id,
            human_leg="c-human",
            state="briefing",
            initiator="api",
            started=time.time(),
        )

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        self._live(call_id)
        self.dtmf.append((call_id, digits))

    async def command_agent(self, call_id: str, command: AgentCommand) -> None:
        call = self._live(call_id)
        if call.state != "active":
            raise CommandRejectedError(f"call {call_id} is {call.state}, not active")
        self.agent_commands.append((call_id, command))

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        self.originated.append((request, admission))
        call = CallSnapshot.model_validate(
            {
                "id": admission.call_id,
                "direction": "outbound",
                "from": request.caller_id,
                "to": request.to,
                "route": admission.route,
                "provider": admission.profile.provider if admission.profile else "",
                "state": "ringing",
                "worker": self.worker_id,
                "started": self.clock(),
            }
        )
        self.calls[call.id] = call
        await self._report("call.started", call)
        return call.id

    async def drain(self, exit_when_empty: bool, deadline_s: float | None = None) -> None:
        self.draining = True
        self.exit_when_empty = exit_when_empty
        self.drains.append(exit_when_empty)
        self.drain_deadlines.append(deadline_s)

    async def snapshot(self) -> list[CallSnapshot]:
        return [call for call in self.calls.values() if call.state != "ended"]

    # ---------------------------------------------------------------------------- driving
    def info(self) -> WorkerInfo:
        live = [call for call in self.calls.values() if call.state != "ended"]
        return WorkerInfo(
            id=self.worker_id,
            url=self.url,
            capacity=self.capacity,
            active_calls=len(live),
            used=sum(call.cost for call in live),
            draining=self.draining,
            version="test",
            registration=self.registration,
            registrations=self.registrations,
        )

    async def connect(self, link: ControlLink) -> WorkerInfo:
        self.link = link
        return await link.register(self.info())

    async def heartbeat(self) -> WorkerInfo:
        assert self.link is not None
        return await self.link.heartbeat(self.info(), await self.snapshot())

    async def _report(self, type: Any, call: CallSnapshot) -> None:
        assert self.link is not None
        await self.link.report([WorkerEvent(type=type, worker=self.worker_id, time=self.clock(), call=call)])

    async def place_call(
        self, called: str, caller: str = "+15550100", *, codec: str = "PCMU", kind: Any = "sip", **extra: Any
    ) -> AdmissionDecision:
        """An inbound call arrives: admit it and, when accepted, answer it and report call.started."""
        assert self.link is not None
        decision = await self.link.admit(
            AdmissionRequest(called=called, caller=caller, kind=kind, worker=self.worker_id, **extra)
        )
        if decision.accepted:
            now = self.clock()
            call = CallSnapshot.model_validate(
                {
                    "id": decision.call_id,
                    "kind": kind,
                    "from": caller,
                    "to": called,
                    "route": decision.route,
                    "provider": decision.profile.provider if decision.profile else "",
                    "state": "active",
                    "worker": self.worker_id,
                    "codec": codec,
                    "cost": extra.get("cost", 1.0),
                    "started": now,
                    "answered": now,
                }
            )
            self.calls[call.id] = call
            await self._report("call.started", call)
        return decision

    async def update_call(self, call_id: str, **changes: Any) -> CallSnapshot:
        call = self.calls[call_id]
        data = call.model_dump(by_alias=True)
        data["stats"] = {**data["stats"], **changes.pop("stats", {})}
        updated = CallSnapshot.model_validate({**data, **changes})
        self.calls[call_id] = updated
        await self._report("call.updated", updated)
        return updated

    async def end_call(self, call_id: str, *, reason: str = "caller_hangup") -> None:
        call = self.calls[call_id]
        now = self.clock()
        ended = call.model_copy(
            update={"state": "ended", "ended": now, "end_reason": reason, "duration_s": now - (call.started or now)}
        )
        self.calls[call_id] = ended
        await self._report("call.ended", ended)
