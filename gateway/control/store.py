"""Control-plane state: workers, calls, admission reservations and the event ring — in memory.

:class:`StateStore` is the seam; :class:`MemoryStore` serves one process (the default), and
:class:`gateway.control.redis_store.RedisStore` shares the same picture between several control-plane
processes (``GATEWAY_REDIS_URL``). Both keep these invariants:

* ``reserve`` is atomic: the global and per-route call counts and the worker's capacity are checked and
  the slot taken in one step, so two admissions can never both take the last slot. A call takes its
  ``cost`` of its worker's capacity (1 for G.711, more for Opus), one slot of the other limits.
* Event ids are contiguous integers (1, 2, 3, ...): a reader that gets first id > last seen + 1 knows
  it missed events (the ring dropped them) and says so.
* Ended calls are kept (newest ``ended_retention``) so ``GET /v1/calls/{id}`` still answers after hang-up.
* ``put_calls`` writes a snapshot only if its call is still ended, or still not, as the writer read it
  (``get_tracked``): the plane reads and decides on a batch of calls, and an end stored meanwhile (the
  worker's report, the plane's own) is never overwritten by a live snapshot taken before it. It compares each
  snapshot with the one stored itself, so a live call's snapshot is never read back to be compared.

The heartbeat's calls go through the batched methods (``get_tracked``, ``put_calls``, ``append_events``,
``held_by``): a few requests per heartbeat, whatever the number of calls, so the Redis-backed plane's cost does
not grow by a round trip per live call.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict

from gateway.fleet.models import CAPACITY_SLACK, CallSnapshot, EventType, FleetEvent, WorkerInfo

ReserveOutcome = Literal["ok", "exists", "global", "route", "worker"]


class Reservation(BaseModel):
    """One admitted call holding a slot of the global, route and worker limits until it ends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    route: str
    worker: str
    admitted_at: float
    cost: float = 1.0  # of the worker's capacity


class TrackedCall(NamedTuple):
    """What tracking a call needs of the store: its snapshot if the call has ended (whose end reason says what a
    later live snapshot means), else None (unknown or live), and its admission slot, if it holds one."""

    ended: CallSnapshot | None
    reservation: Reservation | None


class CallWrite(NamedTuple):
    """A snapshot to store, and whether its call was ended when the writer read it (``put_calls``' guard)."""

    call: CallSnapshot
    was_ended: bool


# What ``put_calls`` did with each snapshot. new: stored where the store held none; changed: replaced another;
# same: equal to the one stored, not written; moved: the call ended (or came back) since it was read, not written.
WriteOutcome = Literal["new", "changed", "same", "moved"]


#: An event to append: its type and its data (``append_events`` gives the batch one time and contiguous ids).
NewEvent = tuple[EventType, dict[str, Any]]


class StateStore(Protocol):
    async def put_worker(self, info: WorkerInfo) -> None: ...
    async def get_worker(self, worker_id: str) -> WorkerInfo | None: ...
    async def list_workers(self) -> list[WorkerInfo]: ...
    async def delete_worker(self, worker_id: str) -> None: ...

    async def reserve(
        self, reservation: Reservation, *, max_calls: int, route_max: int | None, worker_capacity: float
    ) -> ReserveOutcome: ...
    async def set_cost(self, call_id: str, cost: float) -> Reservation | None:
        """Change what a held call takes of its worker's capacity (its codec became known); None if not held."""
        ...

    async def adopt(self, reservations: Sequence[Reservation]) -> None:
        """Hold slots for calls that are up already (reported live, never admitted here), past every limit; a call
        holding one keeps it."""
        ...

    async def get_reservation(self, call_id: str) -> Reservation | None: ...
    async def release(self, call_id: str) -> Reservation | None: ...
    async def reservations(self) -> list[Reservation]: ...
    async def held_by(self, worker_id: str) -> set[str]:
        """The ids of the calls holding a slot of ``worker_id``."""
        ...

    async def held_cost(self) -> dict[str, float]:
        """What the held calls take of each worker's capacity, by worker id (workers holding none are absent)."""
        ...

    async def put_call(self, call: CallSnapshot) -> None: ...
    async def put_calls(self, writes: Sequence[CallWrite]) -> list[WriteOutcome]:
        """Store snapshots in one request, each only if its call is still ended, or not, as ``was_ended`` says and
        differs from the one stored; what was done with each, in order."""
        ...

    async def get_call(self, call_id: str) -> CallSnapshot | None: ...
    async def get_tracked(self, call_ids: Sequence[str]) -> list[TrackedCall]:
        """Each call's end (if it ended) and held slot, in order, in one request."""
        ...

    async def list_calls(self) -> list[CallSnapshot]: ...

    async def append_event(self, type: EventType, data: dict[str, Any], time: float) -> FleetEvent: ...
    async def append_events(self, events: Sequence[NewEvent], time: float) -> list[FleetEvent]:
        """Append several events in one request, with contiguous ids in their order."""
        ...

    async def read_events(self, after: int, wait_s: float = 0.0) -> list[FleetEvent]:
        """Events with id > ``after`` still in the ring; waits up to ``wait_s`` for one when there are none."""
        ...

    async def last_event_id(self) -> int: ...
    async def try_lock(self, name: str, ttl_s: float) -> bool:
        """Take a short lease so only one control-plane process runs a periodic job (liveness sweep)."""
        ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """StateStore for one process. Every method runs without awaiting, so each is atomic on the loop."""

    def __init__(self, *, ring_size: int = 2000, ended_retention: int = 1000) -> None:
        self._workers: dict[str, WorkerInfo] = {}
        self._reservations: dict[str, Reservation] = {}
        self._calls: dict[str, CallSnapshot] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ended_retention = ended_retention
        self._ring: deque[FleetEvent] = deque(maxlen=ring_size)
        self._seq = 0
        self._new_event = asyncio.Event()

    # workers
    async def put_worker(self, info: WorkerInfo) -> None:
        self._workers[info.id] = info

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        return self._workers.get(worker_id)

    async def list_workers(self) -> list[WorkerInfo]:
        return sorted(self._workers.values(), key=lambda w: w.id)

    async def delete_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    # admission
    async def reserve(
        self, reservation: Reservation, *, max_calls: int, route_max: int | None, worker_capacity: float
    ) -> ReserveOutcome:
        if reservation.call_id in self._reservations:
            return "exists"
        if len(self._reservations) >= max_calls:
            return "global"
        held = self._reservations.values()
        if route_max is not None and sum(1 for r in held if r.route == reservation.route) >= route_max:
            return "route"
        used = sum(r.cost for r in held if r.worker == reservation.worker)
        if used + reservation.cost > worker_capacity + CAPACITY_SLACK:
            return "worker"
        self._reservations[reservation.call_id] = reservation
        return "ok"

    async def set_cost(self, call_id: str, cost: float) -> Reservation | None:
        held = self._reservations.get(call_id)
        if held is None:
            return None
        self._reservations[call_id] = updated = held.model_copy(update={"cost": cost})
        return updated

    async def adopt(self, reservations: Sequence[Reservation]) -> None:
        for reservation in reservations:
            self._reservations.setdefault(reservation.call_id, reservation)

    async def get_reservation(self, call_id: str) -> Reservation | None:
        return self._reservations.get(call_id)

    async def release(self, call_id: str) -> Reservation | None:
        return self._reservations.pop(call_id, None)

    async def reservations(self) -> list[Reservation]:
        return list(self._reservations.values())

    async def held_by(self, worker_id: str) -> set[str]:
        return {r.call_id for r in self._reservations.values() if r.worker == worker_id}

    async def held_cost(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for r in self._reservations.values():
            used[r.worker] = used.get(r.worker, 0.0) + r.cost
        return used

    # calls
    async def put_call(self, call: CallSnapshot) -> None:
        self._put(call)

    async def put_calls(self, writes: Sequence[CallWrite]) -> list[WriteOutcome]:
        outcomes: list[WriteOutcome] = []
        for call, was_ended in writes:
            stored = self._calls.get(call.id)
            if (stored is not None and stored.state == "ended") != was_ended:
                outcomes.append("moved")
            elif stored == call:
                outcomes.append("same")
            else:
                self._put(call)
                outcomes.append("new" if stored is None else "changed")
        return outcomes

    def _put(self, call: CallSnapshot) -> None:
        self._calls[call.id] = call
        if call.state == "ended":
            self._ended[call.id] = None
            self._ended.move_to_end(call.id)
            while len(self._ended) > self._ended_retention:
                old, _ = self._ended.popitem(last=False)
                self._calls.pop(old, None)
        else:
            self._ended.pop(call.id, None)

    async def get_call(self, call_id: str) -> CallSnapshot | None:
        return self._calls.get(call_id)

    async def get_tracked(self, call_ids: Sequence[str]) -> list[TrackedCall]:
        tracked = []
        for call_id in call_ids:
            stored = self._calls.get(call_id)
            ended = stored if stored is not None and stored.state == "ended" else None
            tracked.append(TrackedCall(ended, self._reservations.get(call_id)))
        return tracked

    async def list_calls(self) -> list[CallSnapshot]:
        return list(self._calls.values())

    # events
    async def append_event(self, type: EventType, data: dict[str, Any], time: float) -> FleetEvent:
        (event,) = await self.append_events([(type, data)], time)
        return event

    async def append_events(self, events: Sequence[NewEvent], time: float) -> list[FleetEvent]:
        appended = []
        for type, data in events:
            self._seq += 1
            appended.append(FleetEvent(id=self._seq, type=type, time=time, data=data))
        self._ring.extend(appended)
        if appended:
            wake, self._new_event = self._new_event, asyncio.Event()
            wake.set()
        return appended

    def _after(self, after: int) -> list[FleetEvent]:
        if not self._ring or after >= self._ring[-1].id:
            return []
        start = max(0, after - self._ring[0].id + 1)
        return [self._ring[i] for i in range(start, len(self._ring))]

    async def read_events(self, after: int, wait_s: float = 0.0) -> list[FleetEvent]:
        events = self._after(after)
        if events or wait_s <= 0:
            return events
        waiter = self._new_event
        try:
            await asyncio.wait_for(waiter.wait(), timeout=wait_s)
        except TimeoutError:
            return []
        return self._after(after)

    async def last_event_id(self) -> int:
        return self._seq

    async def try_lock(self, name: str, ttl_s: float) -> bool:
        return True

    async def aclose(self) -> None:
        self._new_event.set()
