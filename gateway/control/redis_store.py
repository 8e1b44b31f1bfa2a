"""Control-plane state shared between processes in Redis (``GATEWAY_REDIS_URL``), via redis.asyncio.

Keys (all under a prefix, default ``gateway:``)::

    workers            hash  worker id -> WorkerInfo JSON
    calls              hash  call id -> CallSnapshot JSON
    calls:ended        zset  call id scored by end time (trimmed to the retention)
    admitted           hash  call id -> Reservation JSON
    admitted:route:R   set   call ids holding a slot of route R
    admitted:worker:W  set   call ids holding a slot of worker W
    admitted:cost      hash  worker id -> capacity its held calls take (the sum of their costs)
    events:seq         int   last event id
    events             stream, entry id "<event id>-0", field "e" = {type, time, data} JSON, MAXLEN ring
    lock:<name>        string, SET NX PX lease

Admission and event appends are Lua scripts, so they stay atomic across control-plane processes; the
event ids stay contiguous integers because INCR and XADD happen in the same script. Readers block on
XREAD, so an event appended by one process reaches SSE clients of every other process.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.control.store import Reservation, ReserveOutcome
from gateway.fleet.models import CAPACITY_SLACK, CallSnapshot, EventType, FleetEvent, WorkerInfo

_RESERVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'exists' end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then return 'global' end
local route_max = tonumber(ARGV[3])
if route_max >= 0 and redis.call('SCARD', KEYS[2]) >= route_max then return 'route' end
local used = tonumber(redis.call('HGET', KEYS[4], ARGV[7]) or '0')
if used + tonumber(ARGV[6]) > tonumber(ARGV[4]) + tonumber(ARGV[8]) then return 'worker' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[5])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HINCRBYFLOAT', KEYS[4], ARGV[7], ARGV[6])
return 'ok'
"""

_RELEASE = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return false end
local r = cjson.decode(held)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SREM', ARGV[2] .. r['route'], ARGV[1])
redis.call('SREM', ARGV[3] .. r['worker'], ARGV[1])
if redis.call('SCARD', ARGV[3] .. r['worker']) == 0 then
  redis.call('HDEL', KEYS[2], r['worker'])  -- nothing held: exactly zero, whatever rounding the sums had
else
  redis.call('HINCRBYFLOAT', KEYS[2], r['worker'], -(tonumber(r['cost']) or 1))
end
return held
"""

# The new reservation JSON comes from the caller (only its cost differs), so this script never re-encodes
# the stored one (cjson would round admitted_at to 14 digits).
_SET_COST = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return false end
local r = cjson.decode(held)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[2], r['worker'], tonumber(ARGV[3]) - (tonumber(r['cost']) or 1))
return ARGV[2]
"""

_APPEND = """
local id = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], id .. '-0', 'e', ARGV[1])
return id
"""


class RedisStore:
    """StateStore in Redis. ``prefix`` keeps several gateways (or tests) apart on one server."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gateway:",
        ring_size: int = 2000,
        ended_retention: int = 1000,
        client: aioredis.Redis | None = None,
    ) -> None:
        # redis-py's stubs type every answer as a union of everything; the decoding below is explicit.
        self._redis: Any = client or aioredis.Redis.from_url(url, decode_responses=False)
        self._p = prefix
        self._ring_size = ring_size
        self._ended_retention = ended_retention
        self._reserve = self._redis.register_script(_RESERVE)
        self._release = self._redis.register_script(_RELEASE)
        self._set_cost = self._redis.register_script(_SET_COST)
        self._append = self._redis.register_script(_APPEND)
        self._lock_owner = uuid.uuid4().hex

    def _k(self, name: str) -> str:
        return self._p + name

    async def ping(self) -> None:
        await self._redis.ping()

    # workers
    async def put_worker(self, info: WorkerInfo) -> None:
        await self._redis.hset(self._k("workers"), info.id, info.model_dump_json())

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        raw = await self._redis.hget(self._k("workers"), worker_id)
        return WorkerInfo.model_validate_json(raw) if raw else None

    async def list_workers(self) -> list[WorkerInfo]:
        raw = await self._redis.hvals(self._k("workers"))
        return sorted((WorkerInfo.model_validate_json(v) for v in raw), key=lambda w: w.id)

    async def delete_worker(self, worker_id: str) -> None:
        await self._redis.hdel(self._k("workers"), worker_id)

    # admission
    async def reserve(
        self, reservation: Reservation, *, max_calls: int, route_max: int | None, worker_capacity: float
    ) -> ReserveOutcome:
        keys = [
            self._k("admitted"),
            self._k("admitted:route:" + reservation.route),
            self._k("admitted:worker:" + reservation.worker),
            self._k("admitted:cost"),
        ]
        args: list[str | int | float] = [
            reservation.call_id,
            max_calls,
            -1 if route_max is None else route_max,
            repr(float(worker_capacity)),
            reservation.model_dump_json(),
            repr(float(reservation.cost)),
            reservation.worker,
            repr(CAPACITY_SLACK),
        ]
        outcome = await self._reserve(keys=keys, args=args)
        text = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        if text not in ("ok", "exists", "global", "route", "worker"):
            raise RuntimeError(f"unexpected reserve answer from redis: {text!r}")
        return text  # type: ignore[return-value]

    async def get_reservation(self, call_id: str) -> Reservation | None:
        raw = await self._redis.hget(self._k("admitted"), call_id)
        return Reservation.model_validate_json(raw) if raw else None

    async def set_cost(self, call_id: str, cost: float) -> Reservation | None:
        held = await self.get_reservation(call_id)
        if held is None:
            return None
        updated = held.model_copy(update={"cost": cost})
        raw = await self._set_cost(
            keys=[self._k("admitted"), self._k("admitted:cost")],
            args=[call_id, updated.model_dump_json(), repr(float(cost))],
        )
        return Reservation.model_validate_json(raw) if raw else None

    async def release(self, call_id: str) -> Reservation | None:
        raw = await self._release(
            keys=[self._k("admitted"), self._k("admitted:cost")],
            args=[call_id, self._k("admitted:route:"), self._k("admitted:worker:")],
        )
        return Reservation.model_validate_json(raw) if raw else None

    async def reservations(self) -> list[Reservation]:
        raw = await self._redis.hvals(self._k("admitted"))
        return [Reservation.model_validate_json(v) for v in raw]

    # calls
    async def put_call(self, call: CallSnapshot) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._k("calls"), call.id, call.model_dump_json(by_alias=True))
        if call.state == "ended":
            pipe.zadd(self._k("calls:ended"), {call.id: call.ended or 0.0})
        else:
            pipe.zrem(self._k("calls:ended"), call.id)
        pipe.zcard(self._k("calls:ended"))
        results = await pipe.execute()
        excess = int(results[-1]) - self._ended_retention
        if excess > 0:
            oldest = await self._redis.zpopmin(self._k("calls:ended"), excess)
            if oldest:
                await self._redis.hdel(self._k("calls"), *(member for member, _ in oldest))

    async def get_call(self, call_id: str) -> CallSnapshot | None:
        raw = await self._redis.hget(self._k("calls"), call_id)
        return CallSnapshot.model_validate_json(raw) if raw else None

    async def list_calls(self) -> list[CallSnapshot]:
        raw = await self._redis.hvals(self._k("calls"))
        return [CallSnapshot.model_validate_json(v) for v in raw]

    # events
    async def append_event(self, type: EventType, data: dict[str, Any], time: float) -> FleetEvent:
        body = orjson.dumps({"type": type, "time": time, "data": data})
        event_id = await self._append(keys=[self._k("events:seq"), self._k("events")], args=[body, self._ring_size])
        return FleetEvent(id=int(event_id), type=type, time=time, data=data)

    @staticmethod
    def _decode(entry_id: bytes | str, fields: dict[Any, Any]) -> FleetEvent:
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        raw = fields.get(b"e") or fields.get("e")
        if raw is None:
            raise ValueError(f"event stream entry {text} has no 'e' field")
        body = orjson.loads(raw)
        return FleetEvent(id=int(text.split("-", 1)[0]), **body)

    async def read_events(self, after: int, wait_s: float = 0.0) -> list[FleetEvent]:
        entries = await self._redis.xrange(self._k("events"), min=f"({after}-0", max="+")
        if entries or wait_s <= 0:
            return [self._decode(entry_id, fields) for entry_id, fields in entries]
        answer = await self._redis.xread({self._k("events"): f"{after}-0"}, block=max(1, int(wait_s * 1000)))
        return [self._decode(entry_id, fields) for _stream, items in answer for entry_id, fields in items]

    async def last_event_id(self) -> int:
        raw = await self._redis.get(self._k("events:seq"))
        return int(raw) if raw else 0

    async def try_lock(self, name: str, ttl_s: float) -> bool:
        key = self._k("lock:" + name)
        if await self._redis.set(key, self._lock_owner, nx=True, px=max(1, int(ttl_s * 1000))):
            return True
        # Keep the lease if this process already holds it.
        held = await self._redis.get(key)
        if held is None or held.decode() != self._lock_owner:
            return False
        await self._redis.pexpire(key, max(1, int(ttl_s * 1000)))
        return True

    async def aclose(self) -> None:
        await self._redis.aclose()
