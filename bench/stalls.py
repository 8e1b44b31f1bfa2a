"""``gateway bench stalls``: how long a worker's periodic ops work holds its event loop, in one stretch and in
slices.

The loop that runs a media worker's 20 ms tick also renders its ``/metrics`` and builds its heartbeat to the
control plane (every second, a snapshot of every call), and a tick due meanwhile starts late by the rest of it.
Two pieces of work, each two ways, interleaved, ``--renders`` times, on a uvloop loop:

* ``/metrics`` of a registry with the series a loaded worker serves (every metric of
  :data:`gateway.observability.REGISTRY` with its labels set, observed a few times): prometheus-client's
  ``generate_latest(registry)`` as one call, against :func:`gateway.observability.exposition` (the same bytes,
  a family at a time with the loop let in every half millisecond);
* a heartbeat of ``--calls`` calls (400), through :class:`gateway.fleet.http.HttpControlLink` to an httpx mock
  transport: the snapshots built in one list and sent as one ``HeartbeatRequest`` dumped by pydantic and
  encoded by httpx's ``json=`` (the stdlib encoder), against the worker's way (each snapshot built and dumped
  in its slice, :class:`gateway.slices.Slices`, the body encoded by orjson). A snapshot is built by
  :func:`gateway.worker.reporting.build_snapshot` with a live call's media figures and no session.

While a piece of work runs, a probe callback re-queues itself with ``call_soon`` and notes the longest gap
between two of its runs: the longest stretch the loop was held. Also reported: its CPU time (process time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import uvloop
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from bench._snapshots import live_sip_snapshot
from gateway import observability
from gateway.fleet.http import HttpControlLink
from gateway.fleet.models import CallSnapshot, HeartbeatRequest, WorkerInfo
from gateway.observability import exposition
from gateway.slices import Slices

# Label values of a loaded worker: its id, and a few values of every other label (collector passes by generation
# and trigger, RTP packets by direction, calls by end reason, ...).
_VALUES: dict[str, tuple[str, ...]] = {
    "worker": ("bench",),
    "generation": ("0", "1", "2"),
    "trigger": ("tick", "other"),
    "direction": ("in", "out"),
}
_OTHER_VALUES = ("a", "b", "c")


def loaded_registry() -> CollectorRegistry:
    """A registry with every metric of ``gateway.observability`` (same names, help, labels and buckets), each
    label set filled in and counted/observed."""
    registry = CollectorRegistry(auto_describe=True)
    for original in vars(observability).values():
        if not isinstance(original, MetricWrapperBase):
            continue
        # prometheus-client keeps a metric's definition in these attributes; nothing public exposes them.
        name, documentation = original._name, original._documentation
        labels: tuple[str, ...] = tuple(original._labelnames)
        metric: MetricWrapperBase
        if isinstance(original, Histogram):
            buckets = [bound for bound in original._upper_bounds if bound != float("inf")]
            metric = Histogram(name, documentation, labels, buckets=buckets, registry=registry)
        elif isinstance(original, Counter):
            metric = Counter(name, documentation, labels, registry=registry)
        elif isinstance(original, Gauge):
            metric = Gauge(name, documentation, labels, registry=registry)
        else:
            continue
        for values in _label_sets(labels):
            child = metric.labels(*values) if values else metric
            for i in range(5):
                if isinstance(child, Histogram):
                    child.observe(0.001 * (i + 1) ** 2)
                elif isinstance(child, Counter):
                    child.inc(i)
                elif isinstance(child, Gauge):
                    child.set(i)
    return registry


def _label_sets(labels: tuple[str, ...]) -> list[tuple[str, ...]]:
    sets: list[tuple[str, ...]] = [()]
    for label in labels:
        sets = [(*values, value) for values in sets for value in _VALUES.get(label, _OTHER_VALUES)]
    return sets


def samples_of(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


async def _held(work: Callable[[], Awaitable[bytes]]) -> tuple[float, float, bytes]:
    """(longest stretch the loop was held, CPU time) of one piece of work, in seconds, and its output."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    last = clock()
    longest = 0.0
    probing = True

    def probe() -> None:
        nonlocal last, longest
        now = clock()
        longest = max(longest, now - last)
        last = now
        if probing:
            loop.call_soon(probe)

    await asyncio.sleep(0)
    loop.call_soon(probe)
    await asyncio.sleep(0)  # the probe has run once: ``last`` is set from inside the loop
    cpu = time.process_time()
    output = await work()
    cpu = time.process_time() - cpu
    probing = False
    probe()  # the stretch up to the work's end
    return longest, cpu, output


def _snapshot(number: int, now: float) -> CallSnapshot:
    """A live SIP call's snapshot as the worker builds it (``SipCalls.snapshot_of``), without a session."""
    return live_sip_snapshot(
        number,
        worker="bench",
        route="support",
        started=now - 30.0,
        packets_in=1500 + number,
        packets_out=1500,
        jitter_ms=0.4,
        level=-30.0,
        levels=[-30.0 - i % 7 for i in range(30)],
    )


class _Heartbeats:
    """A heartbeat of ``calls`` calls, both ways, the last request's body kept as the plane would receive it."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.now = time.time()  # the calls' start, the same for both ways
        self.info = WorkerInfo(id="bench", capacity=calls, active_calls=calls, used=float(calls))
        self.body = b""  # only the last: 400 calls' body is 375 kB, and a run sends hundreds
        answer = self.info.model_dump(mode="json")

        def plane(request: httpx.Request) -> httpx.Response:
            self.body = request.content
            return httpx.Response(200, json=answer)

        self._client = httpx.AsyncClient(transport=httpx.MockTransport(plane))
        self._link = HttpControlLink("http://plane.bench", "bench-token", client=self._client)

    async def one_stretch(self) -> bytes:
        snapshots = [_snapshot(number, self.now) for number in range(self.calls)]
        body = HeartbeatRequest(info=self.info, calls=snapshots).model_dump(mode="json", by_alias=True)
        await self._client.post("http://plane.bench/workers/bench/heartbeat", json=body)
        return self.body

    async def in_slices(self) -> bytes:
        slices = Slices()
        snapshots = []
        for number in range(self.calls):
            snapshots.append(_snapshot(number, self.now))
            await slices.next()
        await self._link.heartbeat(self.info, snapshots)
        return self.body

    async def aclose(self) -> None:
        await self._client.aclose()


async def _measure(renders: int, calls: int) -> dict[str, Any]:
    registry = loaded_registry()
    heartbeats = _Heartbeats(calls)

    async def library() -> bytes:
        return generate_latest(registry)

    async def ours() -> bytes:
        return await exposition(registry)

    cases: dict[str, dict[str, Callable[[], Awaitable[bytes]]]] = {
        "/metrics": {"generate_latest": library, "exposition": ours},
        f"heartbeat, {calls} calls": {"one stretch": heartbeats.one_stretch, "in slices": heartbeats.in_slices},
    }
    held: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], bytes] = {}
    try:
        for _ in range(renders):
            for case, ways in cases.items():
                for way, work in ways.items():
                    longest, spent, output = await _held(work)
                    held.setdefault((case, way), []).append(longest)
                    cpu.setdefault((case, way), []).append(spent)
                    outputs[(case, way)] = output
    finally:
        await heartbeats.aclose()
    # The same content both ways: the same bytes of /metrics; the same JSON document for a heartbeat (the two
    # encoders differ in spacing only), apart from each snapshot's duration_s, which moves with the clock.
    same = {"/metrics": outputs[("/metrics", "generate_latest")] == outputs[("/metrics", "exposition")]}
    beat = f"heartbeat, {calls} calls"
    same[beat] = _without_durations(outputs[(beat, "one stretch")]) == _without_durations(outputs[(beat, "in slices")])
    rows = [
        {
            "case": case,
            "way": way,
            "held_ms_median": 1000 * statistics.median(held[(case, way)]),
            "held_ms_p99": 1000 * _quantile(held[(case, way)], 0.99),
            "held_ms_max": 1000 * max(held[(case, way)]),
            "cpu_ms_median": 1000 * statistics.median(cpu[(case, way)]),
        }
        for case, ways in cases.items()
        for way in ways
    ]
    samples = samples_of(outputs[("/metrics", "generate_latest")])
    return {"samples": samples, "calls": calls, "renders": renders, "same": same, "rows": rows}


def _without_durations(body: bytes) -> Any:
    document = json.loads(body)
    for call in document["calls"]:
        call.pop("duration_s")
    return document


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(*, renders: int = 200, calls: int = 400, json_output: bool = False) -> int:
    report = uvloop.run(_measure(renders, calls))
    if json_output:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"gateway bench stalls: /metrics of {report['samples']} samples and a heartbeat of {calls} calls, "
            f"{renders} times each way, interleaved, uvloop; same content: {report['same']}"
        )
        print(f"{'case':<22} {'way':<16} {'loop held ms: median':>21} {'p99':>6} {'max':>6} {'CPU ms: median':>15}")
        for row in report["rows"]:
            print(
                f"{row['case']:<22} {row['way']:<16} {row['held_ms_median']:>21.2f} {row['held_ms_p99']:>6.2f} "
                f"{row['held_ms_max']:>6.2f} {row['cpu_ms_median']:>15.2f}"
            )
        rows = report["rows"]
        for theirs, ours in zip(rows[::2], rows[1::2], strict=True):
            print(
                f"{ours['case']}: {ours['way']} / {theirs['way']}: loop held "
                f"{ours['held_ms_median'] / theirs['held_ms_median']:.2f}x, "
                f"CPU {ours['cpu_ms_median'] / theirs['cpu_ms_median']:.2f}x (medians)"
            )
    return 0 if all(report["same"].values()) else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--renders", type=int, default=200, help="times each piece of work runs each way")
    parser.add_argument("--calls", type=int, default=400, help="calls in the heartbeat")


def main(args: argparse.Namespace) -> int:
    if args.renders < 1 or args.calls < 1:
        raise SystemExit("gateway bench stalls: --renders and --calls must be at least 1")
    return run(renders=args.renders, calls=args.calls, json_output=args.json)
