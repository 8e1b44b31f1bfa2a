"""``gateway bench scrape``: how long one ``GET /metrics`` holds a worker's event loop, two ways.

A media worker renders ``/metrics`` on the event loop that runs its 20 ms media tick, so a render is time the
tick cannot start in. This fills a registry with the series a loaded worker serves (every metric of
:data:`gateway.observability.REGISTRY` with its labels set, observed a few times), then renders it
``--renders`` times each way, interleaved, on a uvloop loop:

* ``generate_latest``: prometheus-client's ``generate_latest(registry)``, as one call;
* ``exposition``: :func:`gateway.observability.exposition`, the same bytes, made a family at a time with the
  loop let in every half millisecond.

While a render runs, a probe callback re-queues itself with ``call_soon`` and notes the longest gap between
two of its runs: the longest stretch the loop was held. Also reported: the render's CPU time (process time),
so the cost of letting the loop in is seen too.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway import observability
from gateway.observability import exposition

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


async def _held(render: Callable[[], Awaitable[bytes]]) -> tuple[float, float, bytes]:
    """(longest stretch the loop was held, CPU time) of one render, in seconds, and its output."""
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
    text = await render()
    cpu = time.process_time() - cpu
    probing = False
    probe()  # the stretch up to the render's end
    return longest, cpu, text


async def _measure(renders: int) -> dict[str, Any]:
    registry = loaded_registry()

    async def library() -> bytes:
        return generate_latest(registry)

    async def ours() -> bytes:
        return await exposition(registry)

    ways: dict[str, Callable[[], Awaitable[bytes]]] = {"generate_latest": library, "exposition": ours}
    held: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    texts: dict[str, bytes] = {}
    for _ in range(renders):
        for name, render in ways.items():
            longest, spent, text = await _held(render)
            held[name].append(longest)
            cpu[name].append(spent)
            texts[name] = text
    same = texts["generate_latest"] == texts["exposition"]
    rows = {
        name: {
            "held_ms_median": 1000 * statistics.median(held[name]),
            "held_ms_p99": 1000 * _quantile(held[name], 0.99),
            "held_ms_max": 1000 * max(held[name]),
            "cpu_ms_median": 1000 * statistics.median(cpu[name]),
        }
        for name in ways
    }
    return {"samples": samples_of(texts["generate_latest"]), "renders": renders, "same_bytes": same, "rows": rows}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(*, renders: int = 200, json_output: bool = False) -> int:
    report = uvloop.run(_measure(renders))
    if json_output:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"gateway bench scrape: {report['samples']} samples, {renders} renders each way, interleaved, uvloop; "
            f"same bytes: {report['same_bytes']}"
        )
        print(f"{'way':<16} {'loop held ms: median':>21} {'p99':>6} {'max':>6} {'CPU ms: median':>15}")
        for name, row in report["rows"].items():
            print(
                f"{name:<16} {row['held_ms_median']:>21.2f} {row['held_ms_p99']:>6.2f} {row['held_ms_max']:>6.2f} "
                f"{row['cpu_ms_median']:>15.2f}"
            )
        ours, theirs = report["rows"]["exposition"], report["rows"]["generate_latest"]
        print(
            f"exposition / generate_latest: loop held {ours['held_ms_median'] / theirs['held_ms_median']:.2f}x, "
            f"CPU {ours['cpu_ms_median'] / theirs['cpu_ms_median']:.2f}x (medians)"
        )
    return 0 if report["same_bytes"] else 1
