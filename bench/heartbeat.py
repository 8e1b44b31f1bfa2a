"""``gateway bench heartbeat``: what the control plane spends on a worker's heartbeat per live call, its state in
Redis, with the heartbeat's calls tracked in a few batched store requests against one request per call and step.

A ``redis-server`` of its own on loopback. For each size N (``--calls``) and repeat, three paths, their order
rotating from repeat to repeat:

* **batched**: :meth:`ControlPlane.heartbeat` over :class:`RedisStore`, as the plane runs;
* **per call**: the same plane over :class:`PerCallStore`, which does each batched operation one call at a time,
  the way the plane tracked a heartbeat's calls before: per call a read of its snapshot and one of its slot, a
  write, an event append, and every slot read to find the worker's;
* **memory**: over :class:`MemoryStore`, no Redis: what tracking costs in itself.

A run registers a worker and sends two heartbeats of its N live calls (the plane adopts them: slots and
``call.started``), then times ``--heartbeats`` more, in which every call's snapshot changes as a live call's does
from one second to the next (packet counters, duration, a level sample). Reported per path: the plane's CPU per
call per heartbeat (process time of ``heartbeat``; at one heartbeat a second, its CPU per live call-second), the
heartbeat's wall time, Redis's own CPU per call (its ``INFO cpu``) and the requests the plane sent Redis per
heartbeat (counted on its connections: a pipeline or a script run is one). The snapshots are built before the
timing (that is the worker's work), and HTTP is left out (``gateway bench cluster`` has the whole path).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

from bench import arguments
from bench._snapshots import live_sip_snapshot
from bench.processes import BenchProcess, free_port
from gateway.control.config import GatewayConfig, parse_config
from gateway.control.plane import ControlPlane
from gateway.control.redis_store import RedisStore
from gateway.control.store import (
    CallWrite,
    MemoryStore,
    NewEvent,
    Reservation,
    TrackedCall,
    WriteOutcome,
)
from gateway.fleet.models import CallSnapshot, FleetEvent, WorkerInfo

PATHS = ("batched", "per call", "memory")
DEFAULT_SIZES = (50, 100, 200, 400)
_WORKER = "bench-worker"


class _CountingConnection(aioredis.Connection):
    """A connection that counts what it sends: one command, one pipeline or one script run is one request."""

    sent = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        _CountingConnection.sent += 1
        await super().send_packed_command(command, check_health)


class PerCallStore:
    """A :class:`RedisStore` whose batched operations go one call per request, as the plane's tracking did before
    it batched them (the requests and the parsing of that way; the guard against a concurrent end is the batched
    store's, which a benchmark with one writer never meets)."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._read: dict[str, CallSnapshot | None] = {}

    async def get_tracked(self, call_ids: Sequence[str]) -> list[TrackedCall]:
        tracked = []
        for call_id in call_ids:
            call = await self._store.get_call(call_id)
            self._read[call_id] = call
            ended = call if call is not None and call.state == "ended" else None
            tracked.append(TrackedCall(ended, await self._store.get_reservation(call_id)))
        return tracked

    async def put_calls(self, writes: Sequence[CallWrite]) -> list[WriteOutcome]:
        outcomes: list[WriteOutcome] = []
        for call, _ in writes:
            previous = self._read.pop(call.id, None)
            if previous == call:
                outcomes.append("same")
                continue
            await self._store.put_call(call)
            outcomes.append("new" if previous is None else "changed")
        return outcomes

    async def append_events(self, events: Sequence[NewEvent], time: float) -> list[FleetEvent]:
        return [await self._store.append_event(type, data, time) for type, data in events]

    async def held_by(self, worker_id: str) -> set[str]:
        return {held.call_id for held in await self._store.reservations() if held.worker == worker_id}

    async def held_cost(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for held in await self._store.reservations():
            used[held.worker] = used.get(held.worker, 0.0) + held.cost
        return used

    async def adopt(self, reservations: Sequence[Reservation]) -> None:
        for reservation in reservations:
            await self._store.reserve(reservation, max_calls=1 << 62, route_max=None, worker_capacity=1 << 62)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def snapshots(calls: int, second: int, started: float) -> list[CallSnapshot]:
    """The worker's live calls as its heartbeat ``second`` seconds into them carries them (SipCalls.snapshot_of's
    shape: media figures, 120 level samples, no session)."""
    out = []
    for number in range(calls):
        levels = [-30.0 - (second + i) % 7 for i in range(120)]
        out.append(
            live_sip_snapshot(
                number,
                worker=_WORKER,
                route="bench",
                started=started,
                packets_in=50 * second + number % 3,
                packets_out=50 * second,
                jitter_ms=0.4 + (second % 5) / 10,
                level=levels[-1],
                levels=levels,
            )
        )
    return out


def _config(calls: int) -> GatewayConfig:
    return parse_config(
        {
            "limits": {"max_calls": max(calls * 2, 10)},
            "routes": [{"name": "bench", "did": "*", "profile": "bench"}],
            "profiles": {"bench": {"provider": "echo"}},
        },
        "bench-heartbeat.toml",
    )


async def _redis_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _one_run(url: str, path: str, calls: int, heartbeats: int) -> dict[str, Any]:
    counted = aioredis.Redis.from_url(url, connection_class=_CountingConnection)
    probe = aioredis.Redis.from_url(url)
    redis_store: RedisStore | None = None
    store: Any
    if path == "memory":
        store = MemoryStore(ring_size=2000)
    else:
        redis_store = RedisStore(url, prefix=f"bench-{uuid.uuid4().hex[:8]}:", ring_size=2000, client=counted)
        store = redis_store if path == "batched" else PerCallStore(redis_store)
    plane = ControlPlane(_config(calls), store)
    info = WorkerInfo(id=_WORKER, capacity=calls * 2, active_calls=calls, used=float(calls), version="bench")
    started = time.time() - 60.0
    beats = [snapshots(calls, second, started) for second in range(heartbeats + 2)]
    try:
        for second in range(2):
            await plane.heartbeat(info, beats[second])
        cpu: list[float] = []
        wall: list[float] = []
        redis_before = await _redis_cpu(probe)
        _CountingConnection.sent = 0
        for second in range(2, heartbeats + 2):
            wall_0, cpu_0 = time.perf_counter(), time.process_time()
            await plane.heartbeat(info, beats[second])
            cpu.append(time.process_time() - cpu_0)
            wall.append(time.perf_counter() - wall_0)
        requests = _CountingConnection.sent / heartbeats
        redis_s = await _redis_cpu(probe) - redis_before
        live = [c for c in await plane.list_calls() if c.is_live]
        if len(live) != calls or await store.last_event_id() < 2 * calls:
            raise RuntimeError(f"{path}: the plane holds {len(live)} live calls of {calls}")
    finally:
        await (store if redis_store is None else redis_store).aclose()
        await counted.aclose()
        await probe.aclose()
    return {
        "calls": calls,
        "path": path,
        "plane_us_per_call": statistics.median(cpu) / calls * 1e6,
        "heartbeat_ms": statistics.median(wall) * 1e3,
        "redis_us_per_call": redis_s / (heartbeats * calls) * 1e6 if path != "memory" else 0.0,
        "requests": requests if path != "memory" else 0.0,
    }


async def _measure(url: str, sizes: Sequence[int], heartbeats: int, repeats: int) -> list[dict[str, Any]]:
    runs = []
    for calls in sizes:
        for repeat in range(repeats):
            order = PATHS[repeat % len(PATHS) :] + PATHS[: repeat % len(PATHS)]
            for path in order:
                runs.append({**await _one_run(url, path, calls, heartbeats), "repeat": repeat})
    return runs


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the repeats, per size and path, in the order of ``PATHS``."""
    rows = []
    for calls in sorted({run["calls"] for run in runs}):
        for path in PATHS:
            mine = [run for run in runs if run["calls"] == calls and run["path"] == path]
            if not mine:
                continue
            row: dict[str, Any] = {"calls": calls, "path": path, "repeats": len(mine)}
            for key in ("plane_us_per_call", "heartbeat_ms", "redis_us_per_call", "requests"):
                row[key] = statistics.median(run[key] for run in mine)
            rows.append(row)
    return rows


def _ratio(theirs: float, ours: float) -> str:
    return f"{theirs / ours:.1f}x" if ours > 0 else "-"


def run(
    *, sizes: Sequence[int] = DEFAULT_SIZES, heartbeats: int = 20, repeats: int = 3, json_path: str | None = None
) -> int:
    binary = shutil.which("redis-server")
    if binary is None:
        print("gateway bench heartbeat: needs redis-server (Debian: apt-get install redis-server)")
        return 2
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-heartbeat-") as directory:
        port = free_port()
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", directory]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        server = BenchProcess("redis", argv, Path(directory))
        try:
            version = server.wait_for(r"(?:Redis version=|v=)([0-9.]+)", 15).group(1)
            server.wait_for(r"Ready to accept connections", 15)
            runs = uvloop.run(_measure(f"redis://127.0.0.1:{port}/0", sizes, heartbeats, repeats))
        finally:
            server.stop()
    rows = summarize(runs)
    report = {
        "sizes": list(sizes),
        "heartbeats": heartbeats,
        "repeats": repeats,
        "redis_version": version,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "runs": runs,
    }
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    print(
        f"gateway bench heartbeat: {heartbeats} timed heartbeats per run, {repeats} repeats (medians), the paths "
        f"in turn; redis-server {version} on loopback; load average {load:.2f} before, "
        f"{report['load_after']:.2f} after"
    )
    print(
        f"{'calls':>5}  {'path':<9} {'plane µs/call':>13} {'heartbeat ms':>12} {'Redis µs/call':>13} "
        f"{'requests/heartbeat':>18}"
    )
    for row in rows:
        print(
            f"{row['calls']:>5}  {row['path']:<9} {row['plane_us_per_call']:>13.1f} {row['heartbeat_ms']:>12.2f} "
            f"{row['redis_us_per_call']:>13.1f} {row['requests']:>18.1f}"
        )
    for calls in sorted({row["calls"] for row in rows}):
        by_path = {row["path"]: row for row in rows if row["calls"] == calls}
        batched, per_call = by_path.get("batched"), by_path.get("per call")
        if batched and per_call:
            print(
                f"{calls} calls, per call / batched: plane CPU "
                f"{_ratio(per_call['plane_us_per_call'], batched['plane_us_per_call'])}, heartbeat wall time "
                f"{_ratio(per_call['heartbeat_ms'], batched['heartbeat_ms'])}, Redis CPU "
                f"{_ratio(per_call['redis_us_per_call'], batched['redis_us_per_call'])}"
            )
    print(
        "plane µs/call: the plane's CPU per call per heartbeat (process time), i.e. per live call-second at one "
        "heartbeat a second; Redis µs/call: redis-server's own CPU (INFO cpu) per call per heartbeat; requests: "
        "what the plane sent Redis per heartbeat (a pipeline or a script run counts one)"
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calls",
        type=arguments.sizes,
        default=(50, 100, 200, 400),
        help="comma-separated sizes (default 50,100,200,400)",
    )
    parser.add_argument("--heartbeats", type=int, default=20, help="timed heartbeats per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path per size (medians reported)")
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")


def main(args: argparse.Namespace) -> int:
    if args.heartbeats < 1 or args.repeats < 1 or min(args.calls) < 1:
        raise SystemExit("gateway bench heartbeat: --calls, --heartbeats and --repeats must be at least 1")
    return run(sizes=args.calls, heartbeats=args.heartbeats, repeats=args.repeats, json_path=args.json)
