"""The control plane's core: worker registry, admission, call tracking, liveness, events, commands.

HTTP-free (the FastAPI routers in :mod:`gateway.control.api` call it), so ``gateway run`` drives it
in-process through :class:`gateway.fleet.InProcessControlLink` and tests drive it with a fake clock.

Call events are derived from state transitions, not from what a worker says it did: the first time the
plane learns of a call it publishes ``call.started``, any later change ``call.updated``, and the move to
state "ended" ``call.ended`` (also when the plane ends calls itself: ``worker_lost``, ``vanished``).

A heartbeat's calls are tracked together: what the store holds of them (their ends, their slots) is read in one
store request, their snapshots written in one (each write guarded: an end stored meanwhile is never overwritten
by a live snapshot read before it; such a call is read and decided again), their events appended in one. With
Redis that is a few round trips per heartbeat, not a few per live call.

Liveness: a worker whose last heartbeat (plane clock) is older than ``lost_after_missed`` intervals is
marked lost and its calls end with reason ``worker_lost``; lost and gone workers are forgotten after
``forget_after_s``. Admitted calls missing from their worker's heartbeats for ``admitted_grace_s`` are
released (reason ``vanished``), so a lost admit answer or a crashed call cannot leak a slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentelemetry.trace import StatusCode

from gateway.control.call_hook import HookOutcome, hook_request, refusal
from gateway.control.config import GatewayConfig, RouteConfig
from gateway.control.store import CallWrite, NewEvent, Reservation, StateStore
from gateway.fleet.errors import CallNotFoundError, CommandRejectedError, WorkerNotFoundError
from gateway.fleet.http import HttpWorkerCommands
from gateway.fleet.models import (
    CAPACITY_SLACK,
    AdmissionDecision,
    AdmissionRequest,
    AgentCommand,
    CallSnapshot,
    EventType,
    FleetEvent,
    OriginateRequest,
    TransferLine,
    WarmTransferRequest,
    WorkerEvent,
    WorkerInfo,
)
from gateway.fleet.protocols import WorkerCommands
from gateway.observability import ADMISSIONS_TOTAL, WORKERS
from gateway.slices import SLICE_S, Slices
from gateway.tracing import CALL_ID, plane_span, traceparent_of

log = logging.getLogger(__name__)

# Ends the plane decides for want of news from the worker: a call ended so comes back when the worker reports
# it live (a worker taken for lost that was only out of reach). Any other end was the worker's own report.
_ENDED_FOR_WANT_OF_NEWS = frozenset({"worker_lost", "vanished"})

_STATUSES = ("up", "draining", "lost", "gone")

# Calls tracked per store request: bounds the request (and, in Redis, the script's run) a big heartbeat makes.
TRACK_BATCH = 250
# Rounds for the calls whose end (or revival) was stored between the read and the write: each round re-reads
# them, and one is enough unless they change again meanwhile.
_TRACK_ROUNDS = 3


class RecordSink(Protocol):
    """Where ended calls go to be kept (:class:`gateway.records.RecordWriter`): never waits, never fails a call."""

    def submit(self, call: CallSnapshot, profile: str) -> None: ...


class CallHook(Protocol):
    """Asks a route's call-time application (:class:`gateway.control.call_hook_client.CallHookClient`)."""

    async def ask(self, request: Any, *, route: RouteConfig, config: GatewayConfig) -> HookOutcome: ...


class EventTap(Protocol):
    """Sees every event the plane publishes (:class:`gateway.control.webhooks.WebhookFeed`); never waits."""

    def offer(self, event_type: str, data: dict[str, Any], at: float, *, event_id: int = 0) -> None: ...


class ControlPlane:
    """Implements :class:`gateway.fleet.ControlPlaneApi` plus the operations behind the ops API."""

    def __init__(
        self,
        config: GatewayConfig,
        store: StateStore,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        slice_s: float = SLICE_S,
    ) -> None:
        self.config = config
        self.store = store
        self._token = token
        self._clock = clock
        self.slice_s = slice_s  # how long the heartbeat's work on its calls runs before the loop is let in
        self._local_commands: dict[str, WorkerCommands] = {}
        self._http_commands: dict[str, HttpWorkerCommands] = {}
        self._unknown_fields: dict[str, frozenset[str]] = {}  # by worker: what its messages carried, last logged
        self.shutting_down = asyncio.Event()
        self.records: RecordSink | None = None  # the database of calls' writer, attached by the app's lifespan
        self.call_hook: CallHook | None = None  # asks routes' applications about new calls, attached likewise
        # What the application chose for the admitted calls this process asked it about, until they end, so that a
        # retried admission (its first answer lost on the way) gets the same profile.
        self._hooked: dict[str, HookOutcome] = {}
        self.event_tap: EventTap | None = None  # the event webhooks' feed, attached by the app's lifespan

    def profile_name(self, route_name: str) -> str:
        """The name of the agent profile a route gives its calls ("" for a route the config does not know)."""
        route = self.config.route_named(route_name) if route_name else None
        return route.profile if route is not None else ""

    # ------------------------------------------------------------------------------ worker registry

    def _stamp(self, info: WorkerInfo, *, status: str | None = None) -> WorkerInfo:
        # Every call takes at least 1 of the capacity, so a worker that does not report what they take is no
        # less loaded than its call count.
        used = max(info.used, float(info.active_calls))
        load = used / info.capacity if info.capacity else 1.0
        if status is None:
            status = "draining" if info.draining else "up"
        return info.model_copy(update={"status": status, "last_heartbeat": self._clock(), "load": round(load, 4)})

    async def register(self, info: WorkerInfo, *, commands: WorkerCommands | None = None) -> WorkerInfo:
        if commands is not None:
            self._local_commands[info.id] = commands
        stored = self._stamp(info)
        await self.store.put_worker(stored)
        await self._publish("worker.registered", stored.model_dump(mode="json"))
        log.info("worker %s registered (url=%s capacity=%d)", info.id, info.url or "in-process", info.capacity)
        await self._refresh_worker_gauge()
        return stored

    async def heartbeat(
        self, info: WorkerInfo, calls: Sequence[CallSnapshot], *, commands: WorkerCommands | None = None
    ) -> WorkerInfo:
        previous = await self.store.get_worker(info.id)
        if previous is None or previous.status in ("lost", "gone"):
            # The plane restarted (memory store) or gave the worker up: take it back.
            stored = await self.register(info, commands=commands)
        else:
            stored = self._stamp(info)
            await self.store.put_worker(stored)
            if stored.draining and not previous.draining:  # drained by itself (SIGTERM, `gateway drain`)
                await self._publish("worker.draining", stored.model_dump(mode="json"))
            elif (previous.active_calls, previous.draining, previous.capacity, previous.registration) != (
                stored.active_calls,
                stored.draining,
                stored.capacity,
                stored.registration,  # its trunk registration changed (a refresh, a failure, a removal)
            ):
                await self._publish("worker.updated", stored.model_dump(mode="json"))
        # In `gateway run` this loop also runs the worker's media tick: the work on each call is its own slice.
        slices = Slices(self.slice_s)
        snapshots = []
        for call in calls:
            snapshots.append(call.model_copy(update={"worker": info.id}))
            await slices.next()
        for start in range(0, len(snapshots), TRACK_BATCH):
            await self._track(snapshots[start : start + TRACK_BATCH], slices)
        await self._reconcile(info.id, {call.id for call in calls})
        return stored

    def note_unknown_fields(self, worker_id: str, version: str, fields: Sequence[str]) -> None:
        """A worker's message carried fields this version does not know (it runs a newer one): they were ignored.
        Logged once per worker and set of fields, so the skew of a rolling update shows without flooding."""
        known = frozenset(fields)
        if self._unknown_fields.get(worker_id) == known:
            return
        self._unknown_fields[worker_id] = known
        log.warning(
            "worker %s (version %s) sends fields this control plane does not know; they are ignored until the plane is"
            " updated too: %s",
            worker_id,
            version or "unknown",
            ", ".join(sorted(known)),
        )

    async def list_workers(self) -> list[WorkerInfo]:
        return await self.store.list_workers()

    async def get_worker(self, worker_id: str) -> WorkerInfo:
        worker = await self.store.get_worker(worker_id)
        if worker is None:
            raise WorkerNotFoundError(worker_id)
        return worker

    def commands_for(self, worker: WorkerInfo) -> WorkerCommands:
        local = self._local_commands.get(worker.id)
        if local is not None:
            return local
        cached = self._http_commands.get(worker.id)
        if cached is None or cached.url != worker.url:
            cached = HttpWorkerCommands(worker.url, self._token)
            self._http_commands[worker.id] = cached
        return cached

    async def drain(self, worker_id: str, exit_when_empty: bool, deadline_s: float | None = None) -> WorkerInfo:
        worker = await self.get_worker(worker_id)
        await self.commands_for(worker).drain(exit_when_empty, deadline_s)
        stored = worker.model_copy(update={"draining": True, "status": "draining"})
        await self.store.put_worker(stored)
        details = {"exit_when_empty": exit_when_empty, "deadline_s": deadline_s}
        await self._publish("worker.draining", {**stored.model_dump(mode="json"), **details})
        await self._refresh_worker_gauge()
        return stored

    # ------------------------------------------------------------------------------------ admission

    def _reject(
        self, status: int, reason: str, outcome: str, *, retry: bool = False, contact: str = ""
    ) -> AdmissionDecision:
        ADMISSIONS_TOTAL.labels(outcome=outcome).inc()
        retry_after = self.config.limits.retry_after_s if retry else None
        return AdmissionDecision(
            accepted=False, status=status, code=outcome, reason=reason, retry_after_s=retry_after, contact=contact
        )

    def _accept(
        self, reservation: Reservation, route: RouteConfig, hooked: HookOutcome | None = None
    ) -> AdmissionDecision:
        return AdmissionDecision(
            accepted=True,
            call_id=reservation.call_id,
            worker=reservation.worker,
            route=route.name,
            profile=hooked.profile if hooked is not None and hooked.profile else self.config.profile_for(route),
            metadata=hooked.metadata if hooked is not None else {},
            early_media=route.early_media_model(),
            refer=route.refer_policy(),
            trunk=route.trunk,
        )

    async def _ask_application(self, request: AdmissionRequest, route: RouteConfig, call_id: str) -> HookOutcome | None:
        """The route's call-time application's word on a new inbound call (None: the route has none)."""
        if route.application is None or self.call_hook is None or request.direction != "inbound":
            return None
        body = hook_request(request, call_id=call_id, route=route, config=self.config)
        outcome = await self.call_hook.ask(body, route=route, config=self.config)
        if outcome.fell_back:
            log.warning(
                "call %s: application %s failed (%s); %s",
                call_id,
                route.application.url,
                outcome.problem,
                "the route's profile answers" if outcome.action == "accept" else "refused with 503",
            )
            details = {"call_id": call_id, "route": route.name, "url": route.application.url}
            fallback = route.application.fallback
            await self._publish("call.hook_failed", {**details, "problem": outcome.problem, "fallback": fallback})
        return outcome

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision:
        """Decide, under the call's trace: a span of the worker's (its ``traceparent``), or the current one."""
        with plane_span("control.admit", request.traceparent, call_id=request.call_id or "") as span:
            decision = await self._admit(request)
            span.set_attributes(
                {CALL_ID: decision.call_id or request.call_id or "", "gateway.admission.accepted": decision.accepted}
            )
            if decision.code:
                span.set_status(StatusCode.ERROR, decision.code)
            return decision

    async def _admit(self, request: AdmissionRequest) -> AdmissionDecision:
        if request.call_id:
            held = await self.store.get_reservation(request.call_id)
            route = self.config.route_named(held.route) if held else None
            if held and route:
                return self._accept(held, route, self._hooked.get(held.call_id))
        if request.route is not None:
            route = self.config.route_named(request.route)
            if route is None:
                return self._reject(404, f"no route named {request.route!r}", "no_route")
        else:
            route = self.config.resolve(request.called)
            if route is None:
                return self._reject(404, f"no route for called number {request.called!r}", "no_route")
        if request.public and not route.webrtc_public:
            return self._reject(403, f"route {route.name!r} does not take public WebRTC calls", "forbidden")
        if self.shutting_down.is_set():
            return self._reject(503, "control plane is shutting down", "no_worker", retry=True)

        candidates = [w for w in await self.store.list_workers() if w.status == "up" and w.capacity > 0]
        if request.worker is not None:
            candidates = [w for w in candidates if w.id == request.worker]
            if not candidates:
                return self._reject(503, f"worker {request.worker!r} is not taking calls", "no_worker", retry=True)
        if not candidates:
            return self._reject(503, "no worker is up", "no_worker", retry=True)
        held_by = await self.store.held_cost()
        candidates.sort(key=lambda w: (held_by.get(w.id, 0.0) / w.capacity, held_by.get(w.id, 0.0), w.id))

        call_id = request.call_id or f"c-{uuid.uuid4().hex[:16]}"
        for worker in candidates:
            reservation = Reservation(
                call_id=call_id, route=route.name, worker=worker.id, admitted_at=self._clock(), cost=request.cost
            )
            outcome = await self.store.reserve(
                reservation,
                max_calls=self.config.limits.max_calls,
                route_max=route.max_calls,
                worker_capacity=worker.capacity,
            )
            if outcome == "exists":
                held = await self.store.get_reservation(call_id)
                if held is not None:
                    return self._accept(held, route, self._hooked.get(held.call_id))
            if outcome == "global":
                return self._reject(503, "the gateway is at its concurrent call limit", "over_capacity", retry=True)
            if outcome == "route":
                return self._reject(
                    503, f"route {route.name!r} is at its limit of {route.max_calls} calls", "over_capacity", retry=True
                )
            if outcome == "ok":
                hooked = await self._ask_application(request, route, call_id)
                if hooked is not None and hooked.action != "accept":
                    await self.store.release(call_id)
                    refused = refusal(hooked, request.kind)
                    return self._reject(refused.status, refused.reason, refused.code, contact=refused.contact)
                ADMISSIONS_TOTAL.labels(outcome="accepted").inc()
                if hooked is not None:
                    self._hooked[call_id] = hooked
                profile = hooked.profile if hooked is not None and hooked.profile else self.config.profile_for(route)
                await self._track_one(
                    CallSnapshot.model_validate(
                        {
                            "id": call_id,
                            "direction": request.direction,
                            "kind": request.kind,
                            "from": request.caller,
                            "to": request.called,
                            "route": route.name,
                            "provider": profile.provider,
                            "state": "admitted",
                            "worker": worker.id,
                            "started": self._clock(),
                        }
                    )
                )
                return self._accept(reservation, route, hooked)
        return self._reject(503, "every worker is at capacity", "over_capacity", retry=True)

    # ----------------------------------------------------------------------------- call tracking

    async def report(self, events: Sequence[WorkerEvent]) -> None:
        # One at a time: a report may carry one call's start and its end, each a transition of its own.
        for event in events:
            if event.type == "worker.gone":
                await self._worker_gone(event.worker)
            elif event.type == "security.blocked":
                log.warning("worker %s blocked %s", event.worker, event.data.get("key"))
                await self._publish("security.blocked", {"worker": event.worker, **event.data})
            elif event.call is not None:
                call = event.call.model_copy(update={"worker": event.worker})
                await self._track_one(call)
                if event.type in _TOLD_AS_ITSELF:
                    # A hold or a warm transfer (the call's ``transfer``) is told as itself on the stream, besides
                    # the call.updated its state change made.
                    await self._publish(event.type, _event_view(call))
                elif event.type == "guardrail.tripped" and call.stats.guardrail_trips:
                    trip = call.stats.guardrail_trips[-1]
                    await self._publish("guardrail.tripped", {"call_id": call.id, **trip.model_dump(mode="json")})
                elif event.type == "call.amd_detected" and call.amd is not None:
                    await self._publish("call.amd_detected", {"call_id": call.id, **call.amd.model_dump(mode="json")})
                elif event.type.startswith(("agent.", "call.refer")):
                    await self._publish(event.type, {"call_id": call.id, **event.data})

    async def _track_one(self, call: CallSnapshot, *, plane_end: bool = False) -> None:
        await self._track([call], Slices(self.slice_s), plane_end=plane_end)

    async def _track(self, calls: Sequence[CallSnapshot], slices: Slices, *, plane_end: bool = False) -> None:
        """Store call snapshots and publish the transitions they represent, a few store requests for them all.

        ``plane_end``: the snapshots are ends the plane decided (worker lost, vanished, ...), which never replace
        an end the store holds already.
        """
        pending = list({call.id: call for call in calls}.values())  # one snapshot per call: its last
        for _ in range(_TRACK_ROUNDS):
            if not pending:
                return
            pending = await self._track_round(pending, slices, plane_end)
        for call in pending:
            log.warning("call %s: its state kept changing while it was tracked; its next snapshot will tell", call.id)

    async def _track_round(self, calls: list[CallSnapshot], slices: Slices, plane_end: bool) -> list[CallSnapshot]:
        """One pass: read, decide, write, publish; returns the calls that ended (or came back) meanwhile."""
        tracked = await self.store.get_tracked([call.id for call in calls])
        changes: list[tuple[CallSnapshot, CallSnapshot | None, Reservation | None]] = []
        for call, (ended, held) in zip(calls, tracked, strict=True):
            if ended is None or self._after_end_is_news(call, ended, plane_end):
                changes.append((call, ended, held))
            await slices.next()
        if not changes:
            return []
        outcomes = await self.store.put_calls([CallWrite(call, ended is not None) for call, ended, _ in changes])
        again: list[CallSnapshot] = []
        events: list[NewEvent] = []
        released: list[str] = []
        adopted: list[Reservation] = []
        costs: list[tuple[str, float]] = []
        for (call, ended, held), outcome in zip(changes, outcomes, strict=True):
            if outcome == "moved":
                again.append(call)
                continue
            if outcome == "same":
                continue
            if call.state == "ended":
                released.append(call.id)
                if self.records is not None:
                    # Written off the call path (a bounded, retried backlog): this never waits on the database.
                    self.records.submit(call, self.profile_name(call.route))
                if ended is None:
                    events.append(("call.ended", _event_view(call)))
                    if call.recording is not None and call.recording.bytes:  # finished by its worker
                        recording = call.recording.model_dump(mode="json")
                        events.append(("call.recording_ready", {"call_id": call.id, "recording": recording}))
            else:
                if held is None:
                    # A live call the plane holds no slot for (reported after a restart, or never admitted here):
                    # count it so the limits see it; it never fails, the call is already up.
                    adopted.append(
                        Reservation(
                            call_id=call.id,
                            route=call.route,
                            worker=call.worker,
                            admitted_at=self._clock(),
                            cost=call.cost,
                        )
                    )
                elif abs(held.cost - call.cost) > CAPACITY_SLACK:
                    # Admitted before its codec was known (an outbound call, an INVITE without SDP): it now takes
                    # what its codec costs, even past the worker's capacity, since it is up already.
                    costs.append((call.id, call.cost))
                started = ended is not None or outcome == "new"
                events.append(("call.started" if started else "call.updated", _event_view(call)))
            await slices.next()
        for call_id in released:
            self._hooked.pop(call_id, None)
            await self.store.release(call_id)
        await self.store.adopt(adopted)
        for call_id, cost in costs:
            await self.store.set_cost(call_id, cost)
        if events:
            appended = await self.store.append_events(events, self._clock())
            if self.event_tap is not None:
                for event in appended:
                    self.event_tap.offer(event.type, event.data, event.time, event_id=event.id)
        return again

    @staticmethod
    def _after_end_is_news(call: CallSnapshot, ended: CallSnapshot, plane_end: bool) -> bool:
        """Whether a snapshot of a call the store holds as ended is to be stored."""
        if ended == call:
            return False
        if plane_end:
            return False  # it ended meanwhile, on its worker's word or the plane's: that end stands
        if call.state != "ended":
            if ended.end_reason not in _ENDED_FOR_WANT_OF_NEWS:
                # A heartbeat's snapshot taken before the call ended, arriving after the worker reported its end
                # (the two travel apart): the older news is dropped.
                log.info("call %s: a live snapshot after it ended (%s) is ignored", call.id, ended.end_reason)
                return False
            log.info("call %s reported live again after it ended (%s)", call.id, ended.end_reason)
        return True  # live again after an end for want of news, or a second end (the worker's own reason)

    async def _end_call(self, call_id: str, reason: str) -> None:
        call = await self.store.get_call(call_id)
        self._hooked.pop(call_id, None)
        await self.store.release(call_id)
        if call is None or call.state == "ended":
            return
        now = self._clock()
        began = call.answered or call.started or now
        await self._track_one(
            call.model_copy(
                update={"state": "ended", "ended": now, "end_reason": reason, "duration_s": max(0.0, now - began)}
            ),
            plane_end=True,
        )

    async def _reconcile(self, worker_id: str, reported: set[str]) -> None:
        missing = sorted(await self.store.held_by(worker_id) - reported)
        if not missing:
            return
        grace = self.config.fleet.admitted_grace_s
        now = self._clock()
        for call_id, (_, held) in zip(missing, await self.store.get_tracked(missing), strict=True):
            if held is not None and held.worker == worker_id and now - held.admitted_at > grace:
                log.warning("call %s is not on worker %s any more; releasing its slot", call_id, worker_id)
                await self._end_call(call_id, "vanished")

    async def list_calls(self) -> list[CallSnapshot]:
        return await self.store.list_calls()

    async def get_call(self, call_id: str) -> CallSnapshot:
        call = await self.store.get_call(call_id)
        if call is None:
            raise CallNotFoundError(call_id)
        return call

    # ------------------------------------------------------------------------------------- liveness

    async def sweep(self) -> None:
        """Mark silent workers lost (ending their calls), forget long-dead ones, drop orphan slots."""
        now = self._clock()
        fleet = self.config.fleet
        workers = await self.store.list_workers()
        for worker in workers:
            silent_for = now - worker.last_heartbeat
            if worker.status in ("up", "draining") and silent_for > fleet.lost_after_s:
                lost = worker.model_copy(update={"status": "lost"})
                await self.store.put_worker(lost)
                log.warning("worker %s lost: no heartbeat for %.1f s", worker.id, silent_for)
                await self._publish("worker.lost", lost.model_dump(mode="json"))
                await self._end_worker_calls(worker.id, "worker_lost")
            elif worker.status in ("lost", "gone") and silent_for > fleet.forget_after_s:
                await self.store.delete_worker(worker.id)
                self._local_commands.pop(worker.id, None)
                self._unknown_fields.pop(worker.id, None)
                stale = self._http_commands.pop(worker.id, None)
                if stale is not None:
                    await stale.aclose()
        known = {w.id for w in workers}
        for worker_id in sorted(set(await self.store.held_cost()) - known):
            for call_id in sorted(await self.store.held_by(worker_id)):
                await self._end_call(call_id, "worker_lost")
        await self._refresh_worker_gauge()

    async def _end_worker_calls(self, worker_id: str, reason: str) -> None:
        ids = await self.store.held_by(worker_id)
        ids |= {call.id for call in await self.store.list_calls() if call.worker == worker_id and call.is_live}
        for call_id in sorted(ids):
            await self._end_call(call_id, reason)

    async def _worker_gone(self, worker_id: str) -> None:
        worker = await self.store.get_worker(worker_id)
        if worker is None:
            return
        gone = worker.model_copy(update={"status": "gone", "last_heartbeat": self._clock()})
        await self.store.put_worker(gone)
        await self._publish("worker.gone", gone.model_dump(mode="json"))
        await self._end_worker_calls(worker_id, "worker_gone")
        await self._refresh_worker_gauge()

    async def run_sweeper(self) -> None:
        """Sweep once per heartbeat interval until cancelled (one process at a time holds the lease)."""
        interval = self.config.fleet.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                if await self.store.try_lock("sweep", ttl_s=interval * 3):
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("liveness sweep failed")

    def ready(self, workers: Sequence[WorkerInfo]) -> bool:
        return not self.shutting_down.is_set() and any(w.status == "up" for w in workers)

    # -------------------------------------------------------------------------------- ops commands

    async def originate(self, request: OriginateRequest) -> AdmissionDecision:
        """Admit an outbound call and have its worker dial; returns the (accepted or rejected) decision."""
        if request.route is not None:
            route_name: str | None = request.route
        else:
            route = self.config.resolve(request.caller_id)
            route_name = route.name if route else None
        if route_name is None:
            return self._reject(404, f"no route for caller id {request.caller_id!r}; name one with 'route'", "no_route")
        route_config = self.config.route_named(route_name)
        trunk = request.trunk or (route_config.trunk if route_config is not None else None)
        if trunk is not None and not self.config.knows_trunk(trunk):
            known = ", ".join(sorted({*self.config.trunks, "default"}))
            return self._reject(422, f"unknown trunk {trunk!r} (known: {known})", "unknown_trunk")
        request = request.model_copy(update={"trunk": trunk})
        # An originated call's trace starts here; the worker's call span continues it (the decision carries it).
        with plane_span("control.originate", "", call_id="") as span:
            decision = await self.admit(
                AdmissionRequest(
                    called=request.to,
                    caller=request.caller_id,
                    kind="sip",
                    direction="outbound",
                    route=route_name,
                    worker=request.worker,
                )
            )
            span.set_attribute(CALL_ID, decision.call_id)
            if not decision.accepted:
                return decision
            decision = decision.model_copy(update={"traceparent": traceparent_of(span) if span.is_recording() else ""})
            await self._dial(request, decision)
        return decision

    async def _dial(self, request: OriginateRequest, decision: AdmissionDecision) -> None:
        worker = await self.get_worker(decision.worker)
        try:
            await self.commands_for(worker).originate(request, decision)
        except BaseException:
            await self._end_call(decision.call_id, "originate_failed")
            raise

    async def _live_call_and_commands(self, call_id: str) -> tuple[CallSnapshot, WorkerCommands]:
        call = await self.get_call(call_id)
        if not call.is_live:
            raise CommandRejectedError(f"call {call_id!r} has already ended ({call.end_reason or 'ended'})")
        worker = await self.get_worker(call.worker)
        return call, self.commands_for(worker)

    async def hang_up(self, call_id: str, reason: str) -> None:
        _, commands = await self._live_call_and_commands(call_id)
        await commands.hang_up(call_id, reason)

    async def transfer(self, call_id: str, target: str) -> None:
        _, commands = await self._live_call_and_commands(call_id)
        await commands.transfer(call_id, target)

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        _, commands = await self._live_call_and_commands(call_id)
        await commands.send_dtmf(call_id, digits)

    async def hold(self, call_id: str, held: bool) -> None:
        _, commands = await self._live_call_and_commands(call_id)
        await commands.hold(call_id, held)

    async def warm_transfer(self, call_id: str, request: WarmTransferRequest) -> TransferLine:
        _, commands = await self._live_call_and_commands(call_id)
        return await commands.warm_transfer(call_id, request)

    async def warm_transfer_join(self, call_id: str) -> TransferLine:
        _, commands = await self._live_call_and_commands(call_id)
        return await commands.warm_transfer_join(call_id)

    async def command_agent(self, call_id: str, command: AgentCommand) -> None:
        """Live call control (say, inject, update, handoff), forwarded to the call's worker. A handoff goes with
        the profile it names from this plane's config (CommandRejectedError for a profile it does not have)."""
        _, commands = await self._live_call_and_commands(call_id)
        if command.handoff is not None:
            name = command.handoff.profile
            target = self.config.profiles.get(name)
            if target is None:
                known = ", ".join(sorted(self.config.profiles)) or "none"
                raise CommandRejectedError(f"call {call_id!r}: no profile {name!r} to hand off to (known: {known})")
            command = command.model_copy(update={"target": target})
        await commands.command_agent(call_id, command)

    # ----------------------------------------------------------------------------------- events

    async def _publish(self, type: EventType, data: dict[str, Any]) -> FleetEvent:
        event = await self.store.append_event(type, data, self._clock())
        if self.event_tap is not None:
            self.event_tap.offer(event.type, event.data, event.time, event_id=event.id)
        return event

    async def events_since(self, last_id: int | None, wait_s: float = 0.0) -> tuple[list[FleetEvent], bool, int]:
        """Events after ``last_id`` (None: from now on), whether some were lost (gap), and the new cursor."""
        newest = await self.store.last_event_id()
        if last_id is None:
            return [], False, newest
        gap = last_id > newest  # ids from an earlier life of the store: replay what there is
        after = 0 if gap else last_id
        events = await self.store.read_events(after, wait_s)
        if events and events[0].id > after + 1:
            gap = True
        cursor = events[-1].id if events else max(after, 0 if gap else last_id)
        return events, gap, cursor

    async def _refresh_worker_gauge(self) -> None:
        workers = await self.store.list_workers()
        for status in _STATUSES:
            WORKERS.labels(status=status).set(sum(1 for w in workers if w.status == status))

    async def aclose(self) -> None:
        self.shutting_down.set()
        for commands in self._http_commands.values():
            await commands.aclose()
        self._http_commands.clear()


# Worker events published as themselves with the call (besides the call.updated of its change): holds, transfers.
_TOLD_AS_ITSELF = frozenset(
    {"call.held", "call.resumed", "call.transfer_started", "call.transferred", "call.transfer_failed"}
)


def _event_view(call: CallSnapshot) -> dict[str, Any]:
    """The call as published on the event stream: everything but the transcript (GET /v1/calls/{id} has it)."""
    data = call.model_dump(mode="json", by_alias=True, exclude={"transcript", "tools"})
    data["transcript"] = []
    data["tools"] = []
    return data
