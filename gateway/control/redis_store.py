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

Admission, call writes and event appends are Lua scripts, so they stay atomic across control-plane
processes: a reservation checks every limit and takes its slot in one step; a batch of call snapshots is
written, each under its guard (the call still ended, or not, as read), with the ended set trimmed in the same
step; the event ids stay contiguous integers because INCRBY and the XADDs happen in the same script. Readers
block on XREAD, so an event appended by one process reaches SSE clients of every other process.

Reads ignore fields this version does not know: during a rolling update a newer control-plane process shares
the Redis and writes them (events of a type unknown here are left out, logged once).

A heartbeat costs a few requests whatever its number of calls: one pipelined HMGET of their snapshots and
slots, one script writing the snapshots that changed, one appending their events, one SMEMBERS of the
worker's slots (``ControlPlane.heartbeat``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError

from gateway.control.store import CallWrite, NewEvent, Reservation, ReserveOutcome, TrackedCall, WriteOutcome
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

# A call is ended when its id is in calls:ended and its snapshot in calls (the two change together, in scripts).
# KEYS: calls, calls:ended, admitted. ARGV: call ids. Answers per call its snapshot if ended (else nil) and its
# reservation (or nil).
_TRACKED = """
local out = {}
for i = 1, #ARGV do
  local ended = false
  if redis.call('ZSCORE', KEYS[2], ARGV[i]) then ended = redis.call('HGET', KEYS[1], ARGV[i]) end
  out[2 * i - 1] = ended
  out[2 * i] = redis.call('HGET', KEYS[3], ARGV[i])
end
return out
"""

# KEYS: calls, calls:ended. ARGV: the retention, then per call: id, snapshot JSON, end time ("" while live),
# guard ("1": write only if the call is ended now, "0": only if it is not, "-": always). Answers per call
# n (new), c (changed), s (same as stored: not written) or m (moved: the guard failed, not written).
_PUT_CALLS = """
local outcomes = {}
for i = 2, #ARGV, 4 do
  local id, snapshot, guard = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  local stored = redis.call('HGET', KEYS[1], id)
  local listed = redis.call('ZSCORE', KEYS[2], id)
  local ended_now = (stored and listed) and '1' or '0'
  if guard ~= '-' and guard ~= ended_now then
    outcomes[#outcomes + 1] = 'm'
  elseif stored == snapshot then
    outcomes[#outcomes + 1] = 's'
  else
    redis.call('HSET', KEYS[1], id, snapshot)
    if ARGV[i + 2] ~= '' then
      redis.call('ZADD', KEYS[2], ARGV[i + 2], id)
    elseif listed then
      redis.call('ZREM', KEYS[2], id)
    end
    outcomes[#outcomes + 1] = stored and 'c' or 'n'
  end
end
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[1])
if excess > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[2], excess)
  for j = 1, #oldest, 2 do redis.call('HDEL', KEYS[1], oldest[j]) end
end
return outcomes
"""
_OUTCOMES: dict[bytes, WriteOutcome] = {b"n": "new", b"c": "changed", b"s": "same", b"m": "moved"}

# ARGV: the ring size, then one event body per event. Answers the first new id.
_APPEND = """
local count = #ARGV - 1
local last = redis.call('INCRBY', KEYS[1], count)
for i = 1, count do
  redis.call('XADD', KEYS[2], (last - count + i) .. '-0', 'e', ARGV[i + 1])
end
redis.call('XTRIM', KEYS[2], 'MAXLEN', ARGV[1])
return last - count + 1
"""

log = logging.getLogger(__name__)

# Slots for calls that are up already: the limits cannot refuse them (max_calls and capacity out of reach).
_UNLIMITED = 1 << 62


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
        self._put_calls = self._redis.register_script(_PUT_CALLS)
        self._tracked = self._redis.register_script(_TRACKED)
        self._lock_owner = uuid.uuid4().hex
        self._unknown_event_types: set[str] = set()  # published by a newer process on the same Redis; logged

    def _k(self, name: str) -> str:
        return self._p + name

    async def ping(self) -> None:
        await self._redis.ping()

    # workers
    async def put_worker(self, info: WorkerInfo) -> None:
        await self._redis.hset(self._k("workers"), info.id, info.model_dump_json())

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        raw = await self._redis.hget(self._k("workers"), worker_id)
        return WorkerInfo.model_validate_json(raw, extra="ignore") if raw else None

    async def list_workers(self) -> list[WorkerInfo]:
        raw = await self._redis.hvals(self._k("workers"))
        return sorted((WorkerInfo.model_validate_json(v, extra="ignore") for v in raw), key=lambda w: w.id)

    async def delete_worker(self, worker_id: str) -> None:
        await self._redis.hdel(self._k("workers"), worker_id)

    # admission
    def _reserve_call(
        self, reservation: Reservation, max_calls: int, route_max: int | None, worker_capacity: float
    ) -> tuple[list[str], list[str | int | float]]:
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
        return keys, args

    async def reserve(
        self, reservation: Reservation, *, max_calls: int, route_max: int | None, worker_capacity: float
    ) -> ReserveOutcome:
        keys, args = self._reserve_call(reservation, max_calls, route_max, worker_capacity)
        return _outcome(await self._reserve(keys=keys, args=args))

    async def adopt(self, reservations: Sequence[Reservation]) -> None:
        if not reservations:
            return
        # One script run per slot (each atomic), all in one pipelined request.
        pipe = self._redis.pipeline(transaction=False)
        for reservation in reservations:
            keys, args = self._reserve_call(reservation, _UNLIMITED, None, _UNLIMITED)
            await self._reserve(keys=keys, args=args, client=pipe)
        for outcome in await pipe.execute():
            _outcome(outcome)

    async def get_reservation(self, call_id: str) -> Reservation | None:
        raw = await self._redis.hget(self._k("admitted"), call_id)
        return Reservation.model_validate_json(raw, extra="ignore") if raw else None

    async def set_cost(self, call_id: str, cost: float) -> Reservation | None:
        held = await self.get_reservation(call_id)
        if held is None:
            return None
        updated = held.model_copy(update={"cost": cost})
        raw = await self._set_cost(
            keys=[self._k("admitted"), self._k("admitted:cost")],
            args=[call_id, updated.model_dump_json(), repr(float(cost))],
        )
        return Reservation.model_validate_json(raw, extra="ignore") if raw else None

    async def release(self, call_id: str) -> Reservation | None:
        raw = await self._release(
            keys=[self._k("admitted"), self._k("admitted:cost")],
            args=[call_id, self._k("admitted:route:"), self._k("admitted:worker:")],
        )
        return Reservation.model_validate_json(raw, extra="ignore") if raw else None

    async def reservations(self) -> list[Reservation]:
        raw = await self._redis.hvals(self._k("admitted"))
        return [Reservation.model_validate_json(v, extra="ignore") for v in raw]

    async def held_by(self, worker_id: str) -> set[str]:
        members = await self._redis.smembers(self._k("admitted:worker:" + worker_id))
        return {m.decode() for m in members}

    async def held_cost(self) -> dict[str, float]:
        raw = await self._redis.hgetall(self._k("admitted:cost"))
        return {worker.decode(): float(used) for worker, used in raw.items()}

    # calls
    async def put_call(self, call: CallSnapshot) -> None:
        await self._write_calls([(call, "-")])

    async def put_calls(self, writes: Sequence[CallWrite]) -> list[WriteOutcome]:
        return await self._write_calls([(call, "1" if was_ended else "0") for call, was_ended in writes])

    async def _write_calls(self, writes: Sequence[tuple[CallSnapshot, str]]) -> list[WriteOutcome]:
        if not writes:
            return []
        args: list[str | int] = [self._ended_retention]
        for call, guard in writes:
            end = repr(float(call.ended or 0.0)) if call.state == "ended" else ""
            args += [call.id, call.model_dump_json(by_alias=True), end, guard]
        answers = await self._put_calls(keys=[self._k("calls"), self._k("calls:ended")], args=args)
        return [_OUTCOMES[answer] for answer in answers]

    async def get_call(self, call_id: str) -> CallSnapshot | None:
        raw = await self._redis.hget(self._k("calls"), call_id)
        return CallSnapshot.model_validate_json(raw, extra="ignore") if raw else None

    async def get_tracked(self, call_ids: Sequence[str]) -> list[TrackedCall]:
        if not call_ids:
            return []
        keys = [self._k("calls"), self._k("calls:ended"), self._k("admitted")]
        answer = await self._tracked(keys=keys, args=list(call_ids))
        return [
            TrackedCall(
                CallSnapshot.model_validate_json(ended, extra="ignore") if ended else None,
                Reservation.model_validate_json(slot, extra="ignore") if slot else None,
            )
            for ended, slot in zip(answer[::2], answer[1::2], strict=True)
        ]

    async def list_calls(self) -> list[CallSnapshot]:
        raw = await self._redis.hvals(self._k("calls"))
        return [CallSnapshot.model_validate_json(v, extra="ignore") for v in raw]

    # events
    async def append_event(self, type: EventType, data: dict[str, Any], time: float) -> FleetEvent:
        (event,) = await self.append_events([(type, data)], time)
        return event

    async def append_events(self, events: Sequence[NewEvent], time: float) -> list[FleetEvent]:
        if not events:
            return []
        bodies = [orjson.dumps({"type": type, "time": time, "data": data}) for type, data in events]
        first = int(
            await self._append(keys=[self._k("events:seq"), self._k("events")], args=[self._ring_size, *bodies])
        )
        return [FleetEvent(id=first + i, type=type, time=time, data=data) for i, (type, data) in enumerate(events)]

    def _decode(self, entry_id: bytes | str, fields: dict[Any, Any]) -> FleetEvent | None:
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        raw = fields.get(b"e") or fields.get("e")
        if raw is None:
            raise ValueError(f"event stream entry {text} has no 'e' field")
        body = orjson.loads(raw)
        try:
            return FleetEvent.model_validate({**body, "id": int(text.split("-", 1)[0])}, extra="ignore")
        except ValidationError:
            # An event type a newer control-plane process on the same Redis publishes: this one cannot say it.
            kind = str(body.get("type"))
            if kind not in self._unknown_event_types:
                self._unknown_event_types.add(kind)
                log.warning("event %s: type %r is unknown to this version; such events are left out", text, kind)
            return None

    def _decoded(self, entries: list[tuple[Any, dict[Any, Any]]]) -> list[FleetEvent]:
        return [event for entry_id, fields in entries if (event := self._decode(entry_id, fields)) is not None]

    async def read_events(self, after: int, wait_s: float = 0.0) -> list[FleetEvent]:
        entries = await self._redis.xrange(self._k("events"), min=f"({after}-0", max="+")
        if entries or wait_s <= 0:
            return self._decoded(entries)
        answer = await self._redis.xread({self._k("events"): f"{after}-0"}, block=max(1, int(wait_s * 1000)))
        return self._decoded([entry for _stream, items in answer for entry in items])

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


def _outcome(answer: bytes | str) -> ReserveOutcome:
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    if text not in ("ok", "exists", "global", "route", "worker"):
        raise RuntimeError(f"unexpected reserve answer from redis: {text!r}")
    return text  # type: ignore[return-value]
