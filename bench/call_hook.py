"""``gateway bench call-hook``: the setup latency a route's call-time application adds to a call's admission.

The application is ``bench/_call_hook_app.py`` under uvicorn, a process of its own on loopback (it verifies each
request's signature and accepts with instructions). The control plane runs in this process (uvloop, the in-memory
store, one registered worker), and each admission is :meth:`ControlPlane.admit` as a worker's inbound INVITE asks
it (the INVITE's facts included), timed from the call to the decision. Two routes, the same profile: ``plain``
(no application) and ``hooked``; each repeat admits ``--calls`` calls on each, in alternating blocks whose order
rotates, each call released after its decision. Reported: p50/p99 of both and what the hook adds (p50 and p99
differences, ratio of medians) and the plane's CPU per admission (this process's time: the client side of
the request, signing, parsing the answer), the medians of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from bench.processes import BenchProcess, free_port
from gateway.control.call_hook_client import CallHookClient
from gateway.control.config import parse_config
from gateway.control.plane import ControlPlane
from gateway.control.signing import WebhookSigner
from gateway.control.store import MemoryStore
from gateway.fleet.models import AdmissionRequest, InviteFacts, WorkerInfo

PATHS = ("plain", "hooked")
_SECRET = "bench-call-hook-secret"
_BLOCK = 50  # calls per block: the two paths alternate in blocks, so a slow spell of the machine hits both


def _invite(number: str) -> InviteFacts:
    return InviteFacts(
        request_uri=f"sip:{number}@127.0.0.1",
        from_header="<sip:+15550111@127.0.0.1>",
        from_display_name="Bench Caller",
        to_uri=f"<sip:{number}@127.0.0.1>",
        headers=[("X-Account", "A-42"), ("P-Asserted-Identity", "<sip:+15550111@carrier.example>")],
        transport="udp",
    )


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one_repeat(url: str, calls: int, repeat: int) -> dict[str, Any]:
    config = parse_config(
        {
            "context": {"headers": ["X-Account"], "trusted_sources": ["127.0.0.1"]},
            "limits": {"max_calls": 100_000},
            "routes": [
                {"name": "plain", "did": "+15550100", "profile": "agent"},
                {"name": "hooked", "did": "+15550200", "profile": "agent", "application": {"url": url}},
            ],
            "profiles": {"agent": {"provider": "echo", "instructions": "Help {caller_number}."}},
        },
        "bench",
    )
    plane = ControlPlane(config, MemoryStore(ring_size=1000))
    hook = CallHookClient(signer=WebhookSigner(_SECRET), default_timeout_s=2.0)
    plane.call_hook = hook
    await plane.register(WorkerInfo(id="bench-worker", capacity=100_000))
    numbers = {"plain": "+15550100", "hooked": "+15550200"}
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    cpu: dict[str, float] = dict.fromkeys(PATHS, 0.0)
    failures = 0
    try:
        # A warm-up call each: the application's connection is opened once, as a running plane keeps it.
        for path in PATHS:
            warm = await plane.admit(AdmissionRequest(called=numbers[path], source="127.0.0.1:5060"))
            await plane.store.release(warm.call_id)
        order = PATHS if repeat % 2 == 0 else PATHS[::-1]
        for start in range(0, calls, _BLOCK):
            for path in order:
                for _ in range(min(_BLOCK, calls - start)):
                    request = AdmissionRequest(
                        called=numbers[path], caller="+15550111", source="127.0.0.1:5060", invite=_invite(numbers[path])
                    )
                    began, began_cpu = time.perf_counter(), time.process_time()
                    decision = await plane.admit(request)
                    times[path].append(time.perf_counter() - began)
                    cpu[path] += time.process_time() - began_cpu
                    profile = decision.profile
                    if not decision.accepted or (
                        path == "hooked" and (profile is None or not profile.instructions.startswith("Greet"))
                    ):
                        failures += 1
                    await plane.store.release(decision.call_id)
    finally:
        await hook.aclose()
        await plane.aclose()
    row: dict[str, Any] = {"repeat": repeat, "calls": calls, "failures": failures}
    for path in PATHS:
        row[f"{path}_p50_ms"] = 1000.0 * statistics.median(times[path])
        row[f"{path}_p99_ms"] = 1000.0 * _quantile(times[path], 0.99)
        row[f"{path}_cpu_us"] = 1e6 * cpu[path] / len(times[path])
    return row


def run(*, calls: int = 1000, repeats: int = 5, json_path: str | None = None) -> int:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-call-hook-") as directory:
        port = free_port()
        argv = [sys.executable, "-m", "uvicorn", "bench._call_hook_app:app", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--log-level", "info", "--no-access-log"]
        app = BenchProcess("call-hook-app", argv, Path(directory), env={**os.environ, "BENCH_HOOK_SECRET": _SECRET})
        try:
            app.wait_for(r"Uvicorn running on", 20)
            url = f"http://127.0.0.1:{port}/call"
            rows = [uvloop.run(_one_repeat(url, calls, repeat)) for repeat in range(repeats)]
        finally:
            app.stop()
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0] if key.endswith(("_ms", "_us"))}
    added_p50 = summary["hooked_p50_ms"] - summary["plain_p50_ms"]
    added_p99 = summary["hooked_p99_ms"] - summary["plain_p99_ms"]
    report = {
        "calls": calls,
        "repeats": repeats,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "median": summary,
        "added_p50_ms": added_p50,
        "added_p99_ms": added_p99,
        "rows": rows,
    }
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    print(f"admission of {calls} calls per path, medians of {repeats} repeats (load {load:.2f}):")
    print(f"{'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'plane CPU µs':>13}")
    for path in PATHS:
        p50, p99, cpu_us = (summary[f"{path}_{key}"] for key in ("p50_ms", "p99_ms", "cpu_us"))
        print(f"{path:<8} {p50:8.3f} {p99:8.3f} {cpu_us:13.0f}")
    ratio = summary["hooked_p50_ms"] / summary["plain_p50_ms"] if summary["plain_p50_ms"] else float("nan")
    print(f"the hook adds {added_p50:.3f} ms at p50, {added_p99:.3f} ms at p99 ({ratio:.1f}x the plain median)")
    failures = sum(row["failures"] for row in rows)
    if failures:
        print(f"{failures} admissions did not get the application's answer")
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=1000, help="admissions per path and repeat (default 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported (default 5)")
    parser.add_argument("--json", metavar="FILE", help="write every repeat as JSON")


def main(args: argparse.Namespace) -> int:
    if args.calls < 1 or args.repeats < 1:
        raise SystemExit("--calls and --repeats must be at least 1")
    return run(calls=args.calls, repeats=args.repeats, json_path=args.json)
