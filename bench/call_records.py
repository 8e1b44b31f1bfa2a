"""``gateway bench call-records``: what keeping call records costs the control plane per call.

The same ended calls (each with a transcript of ``--lines`` items and a tool call) are reported to a control plane
twice: without a database of calls, then with one (SQLite in a temp dir, or ``--database-url``) and its writer
running. The difference in the process's CPU time, divided by the calls, is what a record costs the plane: the
submit on the heartbeat's path plus the writer's batched INSERTs. The report's own wall time per call shows the
call path does not wait on the database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.control.config import parse_config
from gateway.control.plane import ControlPlane
from gateway.control.store import MemoryStore
from gateway.fleet.models import CallSnapshot, CallStats, ToolCallLine, TranscriptLine, WorkerEvent
from gateway.records import RecordWriter, open_database, sqlite_url

CONFIG = {"routes": [{"name": "support", "did": "*", "profile": "support"}], "profiles": {"support": {}}}


def _calls(count: int, lines: int, prefix: str) -> list[CallSnapshot]:
    t0 = time.time()
    transcript = [
        TranscriptLine(
            role="user" if i % 2 else "assistant",
            text="I would like to check the status of my order, it has not arrived yet" * 2,
            start_s=i * 4.0,
            end_s=i * 4.0 + 3.0,
        )
        for i in range(lines)
    ]
    tool = ToolCallLine(name="order_status", arguments='{"order": "A-17"}', result='{"status": "shipped"}')
    return [
        CallSnapshot.model_validate(
            {
                "id": f"{prefix}-{n}",
                "from": f"+1555{n:07d}",
                "to": "+15550199",
                "route": "support",
                "provider": "echo",
                "state": "ended",
                "worker": "w",
                "codec": "PCMU",
                "started": t0 + n,
                "answered": t0 + n + 0.4,
                "ended": t0 + n + 60,
                "duration_s": 60.0,
                "end_reason": "caller_hangup",
                "stats": CallStats(mos=4.3, jitter_ms=2.0, provider_latency_p50_ms=400.0),
                "transcript": transcript,
                "tools": [tool],
            }
        )
        for n in range(count)
    ]


async def _report_all(plane: ControlPlane, calls: list[CallSnapshot], batch: int) -> float:
    """Report the calls' ends ``batch`` per report; the slowest report's wall time."""
    slowest = 0.0
    for start in range(0, len(calls), batch):
        events = [
            WorkerEvent(type="call.ended", worker="w", time=c.ended or 0.0, call=c) for c in calls[start:][:batch]
        ]
        began = time.perf_counter()
        await plane.report(events)
        slowest = max(slowest, time.perf_counter() - began)
    return slowest


async def _run_once(calls: int, lines: int, url: str | None, tag: str) -> dict[str, Any]:
    config = parse_config(CONFIG, "bench")
    plain = ControlPlane(config, MemoryStore(ended_retention=calls * 2))
    cpu = time.process_time()
    await _report_all(plain, _calls(calls, lines, f"{tag}-plain"), batch=20)
    plain_cpu = time.process_time() - cpu

    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        database = await open_database(url or sqlite_url(Path(tmp) / "calls.db"))
        try:
            writer = RecordWriter(database)
            task = asyncio.create_task(writer.run(), name="bench-records-writer")
            recorded = ControlPlane(config, MemoryStore(ended_retention=calls * 2))
            recorded.records = writer
            batch = _calls(calls, lines, f"{tag}-rec")
            cpu = time.process_time()
            wall = time.perf_counter()
            slowest = await _report_all(recorded, batch, batch=20)
            reported_wall = time.perf_counter() - wall
            if not await writer.flush(300):
                raise RuntimeError("the writer did not catch up within 300 s")
            written_wall = time.perf_counter() - wall
            recorded_cpu = time.process_time() - cpu
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            dialect = database.dialect
        finally:
            await database.aclose()
    return {
        "engine": dialect,
        "calls": calls,
        "lines": lines,
        "plain_cpu_us_per_call": plain_cpu / calls * 1e6,
        "recorded_cpu_us_per_call": recorded_cpu / calls * 1e6,
        "record_cpu_us_per_call": (recorded_cpu - plain_cpu) / calls * 1e6,
        "slowest_report_ms": slowest * 1e3,
        "reported_s": reported_wall,
        "written_s": written_wall,
        "records_per_s": calls / written_wall,
    }


def run(*, calls: int, lines: int, repeats: int, database_url: str | None, as_json: str | None) -> int:
    runs = [asyncio.run(_run_once(calls, lines, database_url, f"r{i}")) for i in range(repeats)]
    if as_json:
        Path(as_json).write_text(json.dumps(runs, indent=2))
    print(f"{'engine':<10} {'calls':>6} {'lines':>5} {'plain µs':>9} {'recorded µs':>12} {'record µs':>10} "
          f"{'slowest report ms':>18} {'records/s':>10}")  # fmt: skip
    for r in runs:
        print(
            f"{r['engine']:<10} {r['calls']:>6} {r['lines']:>5} {r['plain_cpu_us_per_call']:>9.0f} "
            f"{r['recorded_cpu_us_per_call']:>12.0f} {r['record_cpu_us_per_call']:>10.0f} "
            f"{r['slowest_report_ms']:>18.2f} {r['records_per_s']:>10.0f}"
        )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=2000, help="ended calls per run (default 2000)")
    parser.add_argument("--lines", type=int, default=20, help="transcript items per call (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--database-url", help="postgresql://... to measure PostgreSQL (default: SQLite in a temp dir)")
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")


def main(args: argparse.Namespace) -> int:
    if args.calls < 1 or args.lines < 0 or args.repeats < 1:
        raise SystemExit("gateway bench call-records: --calls >= 1, --lines >= 0 and --repeats >= 1")
    return run(
        calls=args.calls, lines=args.lines, repeats=args.repeats, database_url=args.database_url, as_json=args.json
    )
