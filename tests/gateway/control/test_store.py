"""The StateStore contract, run against MemoryStore and RedisStore (a real redis-server on loopback)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import redis

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.redis_store import RedisStore
from gateway.control.settings import ControlSettings
from gateway.control.store import CallWrite, MemoryStore, Reservation, StateStore, TrackedCall
from gateway.fleet import AdmissionRequest, CallSnapshot, InProcessControlLink, TrunkRegistration, WorkerInfo
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.fleet.fake_worker import FakeWorker


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        made: StateStore = MemoryStore(ring_size=5, ended_retention=2)
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}:", ring_size=5, ended_retention=2)
    yield made
    await made.aclose()


def _reservation(call_id: str, route: str = "r", worker: str = "w", cost: float = 1.0) -> Reservation:
    return Reservation(call_id=call_id, route=route, worker=worker, admitted_at=1.0, cost=cost)


async def test_workers_roundtrip(store: StateStore) -> None:
    await store.put_worker(WorkerInfo(id="b", capacity=3))
    await store.put_worker(WorkerInfo(id="a", url="http://x"))
    assert [w.id for w in await store.list_workers()] == ["a", "b"]
    assert (await store.get_worker("b")).capacity == 3  # type: ignore[union-attr]
    await store.delete_worker("b")
    assert await store.get_worker("b") is None


async def test_a_workers_trunk_registration_is_kept_as_sent(store: StateStore) -> None:
    registration = TrunkRegistration(
        state="failed",
        registrar="sip:registrar.test",
        aor="sip:+15550100@registrar.test",
        contact='<sip:gateway@10.0.0.5:5060>;+sip.instance="<urn:uuid:1>"',
        expires_s=None,
        next_attempt_at=1767225612.5,
        last_status=401,
        last_error="sip:registrar.test refused the credentials of user 'gw' for realm 'registrar.test'",
        attempts=3,
    )
    await store.put_worker(WorkerInfo(id="a", registration=registration))
    await store.put_worker(WorkerInfo(id="b"))
    stored = {w.id: w.registration for w in await store.list_workers()}
    assert stored == {"a": registration, "b": None}


async def test_reserve_checks_every_limit_atomically(store: StateStore) -> None:
    limits = {"max_calls": 3, "route_max": 2, "worker_capacity": 2}
    assert await store.reserve(_reservation("c1"), **limits) == "ok"
    assert await store.reserve(_reservation("c1"), **limits) == "exists"
    assert await store.reserve(_reservation("c2"), **limits) == "ok"
    assert await store.reserve(_reservation("c3"), **limits) == "route"
    assert await store.reserve(_reservation("c3", route="s"), **limits) == "worker"
    assert await store.reserve(_reservation("c3", route="s", worker="v"), **limits) == "ok"
    assert await store.reserve(_reservation("c4", route="t", worker="u"), **limits) == "global"
    released = await store.release("c1")
    assert released == _reservation("c1")
    assert await store.release("c1") is None
    assert await store.reserve(_reservation("c4"), **limits) == "ok"
    assert sorted(r.call_id for r in await store.reservations()) == ["c2", "c3", "c4"]


async def test_a_worker_holds_calls_by_what_they_cost(store: StateStore) -> None:
    limits = {"max_calls": 100, "route_max": None, "worker_capacity": 10}
    assert await store.reserve(_reservation("opus1", cost=8.0), **limits) == "ok"
    assert await store.reserve(_reservation("opus2", cost=8.0), **limits) == "worker"  # 16 > 10
    assert await store.reserve(_reservation("g1"), **limits) == "ok"
    assert await store.reserve(_reservation("g2"), **limits) == "ok"  # 10 of 10: full, not over
    assert await store.reserve(_reservation("g3"), **limits) == "worker"
    assert await store.reserve(_reservation("g3", worker="v"), **limits) == "ok"  # another worker's own capacity
    # A call admitted at one cost that turned out dearer (its codec became known) takes the new cost.
    assert await store.set_cost("g1", 2.0) == _reservation("g1", cost=2.0)
    assert await store.get_reservation("g1") == _reservation("g1", cost=2.0)
    assert await store.set_cost("missing", 2.0) is None
    assert await store.release("opus1") == _reservation("opus1", cost=8.0)
    # 2 + 1 held: a 7 fits, an 8 does not.
    assert await store.reserve(_reservation("opus3", cost=8.0), **limits) == "worker"
    assert await store.reserve(_reservation("opus3", cost=7.0), **limits) == "ok"
    for call_id in ("g1", "g2", "opus3"):
        await store.release(call_id)
    # Nothing held: the whole capacity again, whatever the sums were.
    assert await store.reserve(_reservation("big", cost=10.0), **limits) == "ok"
    assert {r.call_id: r.cost for r in await store.reservations()} == {"big": 10.0, "g3": 1.0}


async def test_costs_that_do_not_add_up_exactly_still_fill_a_worker(store: StateStore) -> None:
    limits = {"max_calls": 100, "route_max": None, "worker_capacity": 3}
    outcomes = [await store.reserve(_reservation(f"c{i}", cost=1.1), **limits) for i in range(3)]
    assert outcomes == ["ok", "ok", "worker"]  # 2.2 held; 3.3 would be over
    assert await store.reserve(_reservation("fill", cost=0.8), **limits) == "ok"  # 3.0000000000000004 is full


async def test_concurrent_reservations_never_exceed_the_limit(store: StateStore) -> None:
    outcomes = await asyncio.gather(
        *(store.reserve(_reservation(f"c{i}"), max_calls=100, route_max=5, worker_capacity=100) for i in range(20))
    )
    assert outcomes.count("ok") == 5 and outcomes.count("route") == 15


async def test_ended_calls_are_retained_up_to_the_limit(store: StateStore) -> None:
    for index in range(4):
        await store.put_call(CallSnapshot(id=f"e{index}", state="ended", ended=float(index)))
    await store.put_call(CallSnapshot(id="live", state="active"))
    ids = sorted(c.id for c in await store.list_calls())
    assert ids == ["e2", "e3", "live"]
    assert (await store.get_call("e3")).state == "ended"  # type: ignore[union-attr]


async def test_event_ids_are_contiguous_and_the_ring_is_bounded(store: StateStore) -> None:
    for index in range(7):
        event = await store.append_event("call.updated", {"n": index}, time=100.0 + index)
        assert event.id == index + 1
    assert await store.last_event_id() == 7
    events = await store.read_events(0)
    assert [e.id for e in events] == [3, 4, 5, 6, 7] and events[0].data == {"n": 2} and events[0].time == 102.0
    assert [e.id for e in await store.read_events(5)] == [6, 7]
    assert await store.read_events(7) == []


async def test_read_waits_for_the_next_event(store: StateStore) -> None:
    await store.append_event("worker.registered", {}, time=1.0)
    reader = asyncio.create_task(store.read_events(1, wait_s=5))
    await asyncio.sleep(0)  # let the reader block first
    await store.append_event("worker.lost", {"id": "w"}, time=2.0)
    async with asyncio.timeout(5):
        events = await reader
    assert [(e.id, e.type) for e in events] == [(2, "worker.lost")]
    assert await store.read_events(2, wait_s=0.05) == []


async def test_lock_lease(store: StateStore) -> None:
    assert await store.try_lock("sweep", ttl_s=5)
    assert await store.try_lock("sweep", ttl_s=5)  # the holder keeps it


async def test_two_redis_stores_compete_for_the_sweep_lease(redis_url: str) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    first, second = RedisStore(redis_url, prefix=prefix), RedisStore(redis_url, prefix=prefix)
    try:
        assert await first.try_lock("sweep", ttl_s=5)
        assert not await second.try_lock("sweep", ttl_s=5)
    finally:
        await first.aclose()
        await second.aclose()


async def test_two_control_planes_share_one_picture_through_redis(redis_url: str) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    config = make_config()
    apps = [
        create_app(
            ControlSettings(api_token=TOKEN, redis_url=redis_url),
            config=config,
            store=RedisStore(redis_url, prefix=prefix),
            sweeper=False,
        )
        for _ in range(2)
    ]
    plane_a: ControlPlane = apps[0].state.plane
    plane_b: ControlPlane = apps[1].state.plane
    worker = FakeWorker("worker-shared")
    try:
        await worker.connect(InProcessControlLink(plane_a, worker))
        first = await worker.place_call("+15550199")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[1]), base_url="http://b") as client_b:
            workers = (await client_b.get("/v1/workers", headers=AUTH)).json()["items"]
            assert [w["id"] for w in workers] == ["worker-shared"]
            calls = (await client_b.get("/v1/calls", headers=AUTH)).json()
            assert [c["id"] for c in calls["items"]] == [first.call_id]
            assert (await client_b.get("/readyz")).status_code == 200

        # The per-route limit (2) holds across both processes.
        second = await plane_b.admit(AdmissionRequest(called="+15550199"))
        third = await plane_a.admit(AdmissionRequest(called="+15550199"))
        assert second.accepted and not third.accepted and third.status == 503

        # An event published by A wakes a reader blocked on B.
        cursor = await plane_b.store.last_event_id()
        reader = asyncio.create_task(plane_b.events_since(cursor, wait_s=5))
        await asyncio.sleep(0)
        await worker.end_call(first.call_id)
        async with asyncio.timeout(5):
            events, gap, _ = await reader
        assert not gap and events[0].type == "call.ended" and events[0].data["id"] == first.call_id
    finally:
        for app in apps:
            await app.state.plane.store.aclose()


# ------------------------------------------------------------------------ the heartbeat's batched operations


def _live(call_id: str, **changes: object) -> CallSnapshot:
    return CallSnapshot.model_validate({"id": call_id, "state": "active", "worker": "w", "started": 1.0, **changes})


def _ended(call_id: str, *, reason: str = "caller_hangup", at: float = 5.0) -> CallSnapshot:
    return CallSnapshot(id=call_id, state="ended", worker="w", started=1.0, ended=at, end_reason=reason)


async def test_tracked_calls_show_their_end_and_their_slot_in_order(store: StateStore) -> None:
    await store.put_call(_live("live"))
    await store.put_call(_ended("gone"))
    await store.reserve(_reservation("live"), max_calls=10, route_max=None, worker_capacity=10)
    tracked = await store.get_tracked(["gone", "nobody", "live"])
    assert tracked == [
        TrackedCall(_ended("gone"), None),  # an ended call comes with its snapshot: its end reason matters
        TrackedCall(None, None),
        TrackedCall(None, _reservation("live")),  # a live one's snapshot is not read back
    ]
    assert await store.get_tracked([]) == []


async def test_put_calls_says_what_it_did_with_each_snapshot(store: StateStore) -> None:
    await store.put_call(_live("same"))
    await store.put_call(_live("moving"))
    await store.put_call(_ended("back", reason="worker_lost"))
    outcomes = await store.put_calls(
        [
            CallWrite(_live("fresh"), was_ended=False),
            CallWrite(_live("same"), was_ended=False),
            CallWrite(_live("moving", stats={"rtp_packets_in": 50}), was_ended=False),
            CallWrite(_live("back"), was_ended=True),  # reported live after an end for want of news
        ]
    )
    assert outcomes == ["new", "same", "changed", "changed"]
    assert (await store.get_call("moving")).stats.rtp_packets_in == 50  # type: ignore[union-attr]
    assert await store.get_call("back") == _live("back")
    assert await store.get_tracked(["back"]) == [TrackedCall(None, None)]  # live again: out of the ended ones
    assert await store.put_calls([]) == []


async def test_a_snapshot_read_before_an_end_never_overwrites_it(store: StateStore) -> None:
    await store.put_call(_live("c"))
    [(ended, _)] = await store.get_tracked(["c"])
    assert ended is None
    await store.put_call(_ended("c"))  # the worker's call.ended lands between the heartbeat's read and its write
    assert await store.put_calls([CallWrite(_live("c", duration_s=3.0), was_ended=False)]) == ["moved"]
    assert await store.get_call("c") == _ended("c")
    # And the other way round: read as ended, live again by the time of the write.
    await store.put_call(_live("d"))
    assert await store.put_calls([CallWrite(_ended("d", reason="vanished"), was_ended=True)]) == ["moved"]
    assert await store.get_call("d") == _live("d")


async def test_a_batch_of_calls_keeps_the_ended_retention(store: StateStore) -> None:
    writes = [CallWrite(_ended(f"e{i}", at=float(i)), was_ended=False) for i in range(4)]
    outcomes = await store.put_calls([*writes, CallWrite(_live("live"), was_ended=False)])
    assert outcomes == ["new"] * 5
    assert sorted(c.id for c in await store.list_calls()) == ["e2", "e3", "live"]  # the 2 newest ends are kept
    assert await store.get_tracked(["e0", "e3"]) == [TrackedCall(None, None), TrackedCall(_ended("e3", at=3.0), None)]


async def test_a_batch_of_events_takes_contiguous_ids_in_order(store: StateStore) -> None:
    await store.append_event("worker.registered", {"id": "w"}, time=1.0)
    batch = await store.append_events([("call.started", {"n": n}) for n in range(3)], time=2.0)
    assert [(e.id, e.type, e.data, e.time) for e in batch] == [(i + 2, "call.started", {"n": i}, 2.0) for i in range(3)]
    assert await store.append_events([], time=3.0) == []
    assert await store.last_event_id() == 4
    assert await store.read_events(1) == batch
    await store.append_events([("call.updated", {"n": n}) for n in range(4)], time=4.0)
    assert [e.id for e in await store.read_events(0)] == [4, 5, 6, 7, 8]  # the ring holds 5


async def test_a_reader_waiting_wakes_for_a_batch(store: StateStore) -> None:
    reader = asyncio.create_task(store.read_events(0, wait_s=5))
    await asyncio.sleep(0)
    await store.append_events([("call.started", {}), ("call.updated", {})], time=1.0)
    async with asyncio.timeout(5):
        events = await reader
    assert [e.type for e in events] == ["call.started", "call.updated"]


async def test_slots_by_worker_and_slots_adopted_past_every_limit(store: StateStore) -> None:
    limits = {"max_calls": 2, "route_max": 1, "worker_capacity": 2}
    assert await store.reserve(_reservation("a"), **limits) == "ok"
    assert await store.reserve(_reservation("b", route="s", worker="v", cost=1.5), **limits) == "ok"
    # Calls reported live that the plane held no slot for: counted whatever the limits; a held slot stays as it is.
    await store.adopt([_reservation("x", cost=8.0), _reservation("a", cost=5.0)])
    await store.adopt([])
    assert await store.get_reservation("a") == _reservation("a")
    assert await store.held_by("w") == {"a", "x"} and await store.held_by("v") == {"b"}
    assert await store.held_by("nobody") == set()
    assert await store.held_cost() == {"w": 9.0, "v": 1.5}
    assert await store.reserve(_reservation("c", route="t"), **limits) == "global"  # 3 held of 2
    for call_id in ("a", "b", "x"):
        await store.release(call_id)
    assert await store.held_cost() == {} and await store.held_by("w") == set()


async def test_what_a_newer_control_plane_wrote_to_redis_is_read_without_its_new_fields(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # During a rolling update of the control plane, old and new processes share the Redis.
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = RedisStore(redis_url, prefix=prefix)
    raw = redis.Redis.from_url(redis_url)
    try:
        worker = WorkerInfo(id="w", capacity=3).model_dump(mode="json") | {"zone": "eu-1"}
        raw.hset(prefix + "workers", "w", orjson.dumps(worker))
        call = _live("c").model_dump(mode="json", by_alias=True) | {"archive": True}
        call["stats"] |= {"dtx_frames": 2}
        raw.hset(prefix + "calls", "c", orjson.dumps(call))
        ended = _ended("e").model_dump(mode="json", by_alias=True) | {"archive": False}
        await store.put_call(_ended("e"))
        raw.hset(prefix + "calls", "e", orjson.dumps(ended))
        slot = _reservation("c").model_dump(mode="json") | {"priority": 1}
        raw.hset(prefix + "admitted", "c", orjson.dumps(slot))
        assert await store.list_workers() == [WorkerInfo(id="w", capacity=3)]
        assert await store.get_call("c") == _live("c")
        assert await store.get_tracked(["c", "e"]) == [
            TrackedCall(None, _reservation("c")),
            TrackedCall(_ended("e"), None),
        ]
        assert await store.reservations() == [_reservation("c")]

        # An event of a type this version does not know is left out (and said once); the others are read.
        await store.append_event("call.started", {"id": "c"}, time=1.0)
        newer = {"type": "call.conferenced", "time": 2.0, "data": {"id": "c"}}
        raw.incr(prefix + "events:seq")
        raw.xadd(prefix + "events", {"e": orjson.dumps(newer)}, id="2-0")
        await store.append_event("call.updated", {"id": "c"}, time=3.0)
        caplog.set_level(logging.WARNING, logger="gateway.control.redis_store")
        for _ in range(2):
            assert [(e.id, e.type) for e in await store.read_events(0)] == [(1, "call.started"), (3, "call.updated")]
        assert [r.getMessage() for r in caplog.records] == [
            "event 2-0: type 'call.conferenced' is unknown to this version; such events are left out"
        ]
    finally:
        raw.close()
        await store.aclose()
