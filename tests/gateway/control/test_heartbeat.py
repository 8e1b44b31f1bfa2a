"""ControlPlane.heartbeat over both stores (memory, and Redis with a real redis-server): a heartbeat's calls are
tracked in a few store requests, with every behaviour tracking one call at a time had."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.control.plane import TRACK_BATCH, ControlPlane
from gateway.control.redis_store import RedisStore
from gateway.control.store import MemoryStore, StateStore, TrackedCall
from gateway.fleet import AdmissionRequest, CallSnapshot, InProcessControlLink, WorkerEvent
from tests.gateway.control.conftest import FakeClock, make_config
from tests.gateway.fleet.fake_worker import FakeWorker


class RacingStore:
    """The plane's real store, with something done by another party right after the plane's next read of
    tracked calls (a report or an end landing between a heartbeat's read and its write)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.after_read: Callable[[], Awaitable[None]] | None = None
        self.reads_to_skip = 0  # reads that go by before the one after which ``after_read`` runs

    async def get_tracked(self, call_ids: Sequence[str]) -> list[TrackedCall]:
        tracked = await self._store.get_tracked(call_ids)
        if self.after_read is not None:
            if self.reads_to_skip:
                self.reads_to_skip -= 1
            else:
                hook, self.after_read = self.after_read, None
                await hook()
        return tracked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass
class Plane:
    plane: ControlPlane
    store: RacingStore
    clock: FakeClock
    worker: FakeWorker

    async def events(self, after: int = 0) -> list[tuple[str, str]]:
        events, _, _ = await self.plane.events_since(after)
        return [(e.type, e.data.get("id", "")) for e in events]

    async def mark(self) -> int:
        return await self.store.last_event_id()  # type: ignore[no-any-return]


@pytest.fixture(params=["memory", "redis"])
async def hb(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Plane]:
    config = make_config(limits={"max_calls": 1000, "retry_after_s": 7})
    if request.param == "memory":
        real: StateStore = MemoryStore(ring_size=5000)
    else:
        url = request.getfixturevalue("redis_url")
        real = RedisStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}:", ring_size=5000)
    store = RacingStore(real)
    plane = ControlPlane(config, store, clock=clock)  # type: ignore[arg-type]
    worker = FakeWorker("worker-a", capacity=1000, clock=clock)
    await worker.connect(InProcessControlLink(plane, worker))
    yield Plane(plane=plane, store=store, clock=clock, worker=worker)
    await real.aclose()


def _live(call_id: str, worker: str = "worker-a", **changes: Any) -> CallSnapshot:
    data = {"id": call_id, "state": "active", "worker": worker, "route": "sales", "started": 1.0, "answered": 1.0}
    return CallSnapshot.model_validate({**data, **changes})


async def test_a_heartbeat_publishes_each_calls_change_once_and_nothing_for_the_unchanged(hb: Plane) -> None:
    calls = [await hb.worker.place_call("+15550201") for _ in range(3)]
    mark = await hb.mark()
    await hb.worker.heartbeat()  # the snapshots it reported already
    assert await hb.events(mark) == [("worker.updated", "worker-a")]
    moved = calls[1].call_id
    hb.worker.calls[moved] = hb.worker.calls[moved].model_copy(update={"duration_s": 1.0})
    mark = await hb.mark()
    await hb.worker.heartbeat()
    await hb.worker.heartbeat()
    assert await hb.events(mark) == [("call.updated", moved)]
    assert (await hb.plane.get_call(moved)).duration_s == 1.0


async def test_live_calls_the_plane_never_admitted_get_slots_and_call_started_in_order(hb: Plane) -> None:
    # A worker reporting after the plane lost its state: more calls than one batch of the store holds.
    count = 2 * TRACK_BATCH + 3
    ids = [f"c-{n:04d}" for n in range(count)]
    hb.worker.calls = {call_id: _live(call_id, cost=2.0 if n % 2 else 1.0) for n, call_id in enumerate(ids)}
    mark = await hb.mark()
    await hb.worker.heartbeat()
    assert await hb.events(mark) == [("worker.updated", "worker-a")] + [("call.started", call_id) for call_id in ids]
    held = {r.call_id: r.cost for r in await hb.store.reservations()}
    assert held == {call_id: 2.0 if n % 2 else 1.0 for n, call_id in enumerate(ids)}
    assert sorted(c.id for c in await hb.plane.list_calls() if c.is_live and c.worker == "worker-a") == ids


async def test_a_call_admitted_at_one_cost_takes_what_its_snapshot_says(hb: Plane) -> None:
    decision = await hb.worker.place_call("+15550201")
    hb.worker.calls[decision.call_id] = hb.worker.calls[decision.call_id].model_copy(update={"cost": 8.0})
    await hb.worker.heartbeat()
    held = await hb.store.get_reservation(decision.call_id)
    assert held is not None and held.cost == 8.0
    assert await hb.store.held_cost() == {"worker-a": 8.0}


async def test_a_heartbeats_live_snapshot_after_the_calls_end_is_ignored(hb: Plane) -> None:
    decision = await hb.worker.place_call("+15550201")
    stale = await hb.worker.snapshot()
    await hb.worker.end_call(decision.call_id, reason="caller_hangup")
    mark = await hb.mark()
    assert hb.worker.link is not None
    await hb.worker.link.heartbeat(hb.worker.info(), stale)
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "caller_hangup")
    assert await hb.store.get_reservation(decision.call_id) is None
    assert await hb.events(mark) == []


async def test_an_end_reported_while_a_heartbeat_is_under_way_stands(hb: Plane) -> None:
    # The worker's call.ended lands after the heartbeat read the call (live) and before it wrote its snapshot.
    decision = await hb.worker.place_call("+15550201")
    other = await hb.worker.place_call("+15550202")
    for call_id in (decision.call_id, other.call_id):
        hb.worker.calls[call_id] = hb.worker.calls[call_id].model_copy(update={"duration_s": 2.0})
    stale = await hb.worker.snapshot()

    async def end_meanwhile() -> None:
        await hb.worker.end_call(decision.call_id, reason="caller_hangup")

    hb.store.after_read = end_meanwhile
    mark = await hb.mark()
    assert hb.worker.link is not None
    await hb.worker.link.heartbeat(hb.worker.info(), stale)
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "caller_hangup")
    assert await hb.store.get_reservation(decision.call_id) is None
    events = await hb.events(mark)
    assert ("call.ended", decision.call_id) in events and ("call.updated", decision.call_id) not in events
    assert ("call.updated", other.call_id) in events  # the rest of the batch went on
    assert (await hb.plane.get_call(other.call_id)).duration_s == 2.0


async def test_an_end_the_plane_decides_never_replaces_the_workers_own(hb: Plane) -> None:
    # The plane ends an admitted call that vanished from the heartbeats; the worker's own end lands meanwhile.
    decision = await hb.plane.admit(AdmissionRequest(called="+15550201", worker="worker-a"))
    hb.clock.advance(11)

    async def worker_ends_it() -> None:
        ended = _live(decision.call_id, state="ended", ended=hb.clock(), end_reason="no_answer")
        await hb.plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=hb.clock(), call=ended)])

    hb.store.after_read = worker_ends_it
    hb.store.reads_to_skip = 1  # the heartbeat's look at the slots it missed; then the read before the plane's end
    mark = await hb.mark()
    await hb.worker.heartbeat()
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "no_answer")
    assert [e for e in await hb.events(mark) if e[0] == "call.ended"] == [("call.ended", decision.call_id)]


async def test_a_call_ended_for_want_of_news_comes_back_with_call_started(hb: Plane) -> None:
    decision = await hb.worker.place_call("+15550201")
    hb.clock.advance(10)
    await hb.plane.sweep()
    assert (await hb.plane.get_call(decision.call_id)).end_reason == "worker_lost"
    assert await hb.store.get_reservation(decision.call_id) is None
    mark = await hb.mark()
    await hb.worker.heartbeat()
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("active", "")
    assert await hb.store.get_reservation(decision.call_id) is not None
    assert await hb.events(mark) == [("worker.registered", "worker-a"), ("call.started", decision.call_id)]


async def test_an_admitted_call_missing_from_the_heartbeats_is_released_after_the_grace(hb: Plane) -> None:
    decision = await hb.plane.admit(AdmissionRequest(called="+15550201", worker="worker-a"))
    kept = await hb.worker.place_call("+15550202")
    await hb.worker.heartbeat()
    assert await hb.store.held_by("worker-a") == {decision.call_id, kept.call_id}
    hb.clock.advance(11)
    await hb.worker.heartbeat()
    assert await hb.store.held_by("worker-a") == {kept.call_id}
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "vanished")


async def test_slots_of_a_worker_the_plane_forgot_end_with_worker_lost(hb: Plane) -> None:
    decision = await hb.worker.place_call("+15550201")
    await hb.store.delete_worker("worker-a")
    await hb.plane.sweep()
    call = await hb.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "worker_lost")
    assert await hb.store.held_cost() == {}


async def test_a_heartbeat_lets_the_loop_in_between_its_calls() -> None:
    # In `gateway run` the plane shares the loop with the media tick: with slices of 0 s it yields after each call.
    clock = FakeClock()
    plane = ControlPlane(make_config(limits={"max_calls": 1000}), MemoryStore(), clock=clock, slice_s=0.0)
    worker = FakeWorker("worker-a", capacity=1000, clock=clock)
    await worker.connect(InProcessControlLink(plane, worker))
    worker.calls = {f"c-{n}": _live(f"c-{n}") for n in range(40)}
    turns = 0
    done = False

    async def probe() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)
    before = turns
    await worker.heartbeat()  # the memory store never suspends: only the slices let the probe run
    during = turns - before
    done = True
    await prober
    assert during >= 40


async def test_a_hold_is_published_as_itself_beside_the_update(hb: Plane) -> None:
    decision = await hb.worker.place_call("+15550201")
    call_id = decision.call_id
    mark = await hb.mark()
    held = _live(call_id, state="held")
    await hb.plane.report([WorkerEvent(type="call.held", worker="worker-a", time=hb.clock(), call=held)])
    assert (await hb.plane.get_call(call_id)).state == "held"
    resumed = _live(call_id, state="active")
    await hb.plane.report([WorkerEvent(type="call.resumed", worker="worker-a", time=hb.clock(), call=resumed)])
    assert await hb.events(mark) == [
        ("call.updated", call_id),
        ("call.held", call_id),
        ("call.updated", call_id),
        ("call.resumed", call_id),
    ]
