"""The figures of ``gateway bench cluster`` (:mod:`bench.cluster`): plain data and pure functions.

A *phase* is one placement of one size's calls, measured once: ``direct`` (every call straight to the first
worker) or ``kamailio`` (every call to Kamailio, which spreads them over both workers). This module reads the
processes' Prometheus expositions (with prometheus-client's own parser), turns one phase's snapshots into a row
of figures (:func:`phase_row`), takes the median of a size's repeats per placement (:func:`median_row`), sets
the two placements side by side (:func:`compare`) and renders the tables.

CPU figures are CPU time per process, never wall-clock capacity: µs of a worker's CPU per call per 20 ms frame
over the measured window (the unit of ``gateway bench calls``), and µs of Kamailio's and the control plane's
CPU per call over the whole phase (setup, teardown, heartbeats), less what each spends idle in as long.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

FRAME_S = 0.02
PLACEMENTS = ("direct", "kamailio")

#: A sample: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[SampleKey, float]


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (sample, have), value in samples.items()
        if sample == name and all((key, want) in have for key, want in labels.items())
    )


def growth(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much the samples ``name`` with ``labels`` grew between two snapshots (counters, histogram counts)."""
    return total(after, name, **labels) - total(before, name, **labels)


def percentiles(values: Iterable[float | None]) -> dict[str, float]:
    """p50, p95, p99 and max of the finite ``values`` (NaN each when there are none). With fewer than 100 values
    p99 is an interpolation between the top two, and close to the max."""
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    p50, p95, p99 = np.percentile(finite, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(finite.max())}


def us_per_call_frame(cpu_s: float, window_s: float, calls: float) -> float:
    """µs of CPU per call per 20 ms frame: ``cpu_s`` spent over ``window_s`` while carrying ``calls``."""
    if calls <= 0 or window_s <= 0:
        return math.nan
    return 1e6 * cpu_s / window_s * FRAME_S / calls


def net_us_per_call(cpu_s: float, idle_rate: float, seconds: float, calls: int) -> float:
    """µs of CPU per call over a phase: ``cpu_s`` less what the process spends idle (``idle_rate`` CPU s/s) in
    ``seconds``, shared out over ``calls``. May come out slightly negative when a call costs less than the noise."""
    if calls <= 0:
        return math.nan
    return 1e6 * (cpu_s - idle_rate * seconds) / calls


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerWindow:
    """One worker over one phase: its metrics at the phase's start, the window's two ends and the phase's end,
    and its CPU seconds at the window's two ends."""

    worker_id: str
    start: Samples
    window_open: Samples
    window_close: Samples
    end: Samples
    cpu_open_s: float
    cpu_close_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseCpu:
    """A helper process's CPU seconds over a whole phase, and its idle rate (CPU s per s with no calls)."""

    cpu_s: float
    idle_rate: float


def worker_figures(worker: WorkerWindow, window_s: float, idle_rate: float = 0.0) -> dict[str, float]:
    """One worker's share of a phase: calls that landed on it (answered by it: its setup histogram's growth over
    the phase), calls up through the window (mean of its active-calls gauge at the window's two ends), its CPU
    per call-frame (as measured, and net of what it spends with no call up, ``idle_rate`` CPU s/s) and share of
    a core over the window, its tick overruns there, SIP input it refused, and the mean of its own setup time
    (INVITE received -> 200 OK sent)."""
    wid = worker.worker_id
    landed = growth(worker.start, worker.end, "gateway_call_setup_seconds_count", worker=wid)
    setup_s = growth(worker.start, worker.end, "gateway_call_setup_seconds_sum", worker=wid)
    up = (
        total(worker.window_open, "gateway_active_calls", worker=wid)
        + total(worker.window_close, "gateway_active_calls", worker=wid)
    ) / 2
    cpu_s = worker.cpu_close_s - worker.cpu_open_s
    return {
        "landed": landed,
        "up": up,
        "cpu_s": cpu_s,
        "core_pct": 100 * cpu_s / window_s if window_s > 0 else math.nan,
        "us_per_call_frame": us_per_call_frame(cpu_s, window_s, up),
        "idle_cpu_s": idle_rate * window_s,
        "us_per_call_frame_net": us_per_call_frame(cpu_s - idle_rate * window_s, window_s, up),
        "overruns": growth(worker.window_open, worker.window_close, "gateway_tick_overruns_total", worker=wid),
        "sip_rejected": growth(worker.start, worker.end, "gateway_sip_rejected_total", worker=wid),
        "setup_mean_ms": 1000 * setup_s / landed if landed else math.nan,
        "setup_s_sum": setup_s,
    }


def phase_row(
    *,
    placement: str,
    calls: int,
    summary: Mapping[str, Any],
    setup_ms: Sequence[float | None],
    workers: Sequence[WorkerWindow],
    window_s: float,
    phase_s: float,
    helpers: Mapping[str, PhaseCpu],
    control_before: Samples,
    control_after: Samples,
    targets_active: int | None = None,
    worker_idle_rates: Sequence[float] | None = None,
    helpers_window: Mapping[str, PhaseCpu] | None = None,
    load_1m: float = math.nan,
) -> dict[str, Any]:
    """One phase's figures. ``summary`` is :func:`gateway.loadtest.results.aggregate` of the load's run,
    ``setup_ms`` every answered call's setup time, ``workers`` every worker of the cluster (in order: the first
    is the one the direct placement dials), ``helpers`` the CPU of Kamailio, the control plane and Redis (those
    running) over the phase and (``helpers_window``) over the window alone, when no call is set up or ended:
    their cost per live call-second (heartbeats, OPTIONS probes); ``worker_idle_rates`` what each worker spends
    with no call up (CPU s/s); ``load_1m`` the machine's load average as the phase began."""
    idle = worker_idle_rates or [0.0] * len(workers)
    figures = [worker_figures(worker, window_s, rate) for worker, rate in zip(workers, idle, strict=True)]
    landed = [f["landed"] for f in figures]
    carrying = [f for f in figures if f["up"] > 0]  # direct: the first worker only (the other idles)
    up = sum(f["up"] for f in carrying)
    cpu_s = sum(f["cpu_s"] for f in carrying)
    idle_s = sum(f["idle_cpu_s"] for f in carrying)
    setup = percentiles(setup_ms)
    answered = int(summary["answered"])
    statuses = {k: int(v) for k, v in summary["statuses"].items() if k != "200"}
    landed_total = sum(landed)
    outcomes = {dict(labels).get("outcome", "") for name, labels in control_after if name == "gateway_admissions_total"}
    refused_by = {
        outcome: int(n)
        for outcome in sorted(outcomes - {"accepted"})
        if (n := growth(control_before, control_after, "gateway_admissions_total", outcome=outcome)) > 0
    }
    row: dict[str, Any] = {
        "calls": calls,
        "placement": placement,
        "answered": answered,
        "failed": calls - answered,
        "statuses": statuses,
        "landed": landed,
        # the busiest worker's share of the calls that landed: 50 % is an even spread over two
        "busiest_pct": 100 * max(landed) / landed_total if landed_total else math.nan,
        "worker_us": [f["us_per_call_frame"] for f in figures],
        "worker_core_pct": [f["core_pct"] for f in figures],
        # the carrying workers' CPU over the calls they carried: the cost of a call-frame wherever it landed
        "us_per_call_frame": us_per_call_frame(cpu_s, window_s, up),
        # the same less each carrying worker's idle CPU (its clock, heartbeats): what the calls themselves cost
        "us_per_call_frame_net": us_per_call_frame(cpu_s - idle_s, window_s, up),
        "overruns": sum(f["overruns"] for f in carrying),
        "sip_rejected": sum(f["sip_rejected"] for f in figures),
        "setup_p50_ms": setup["p50"],
        "setup_p95_ms": setup["p95"],
        "setup_p99_ms": setup["p99"],
        "setup_max_ms": setup["max"],
        "worker_setup_mean_ms": 1000 * sum(f["setup_s_sum"] for f in figures) / landed_total
        if landed_total
        else math.nan,
        "admitted": growth(control_before, control_after, "gateway_admissions_total", outcome="accepted"),
        "refused": sum(refused_by.values()),
        "refused_by": refused_by,  # the control plane's refusals by outcome (over_capacity, no_worker, ...)
        "loss_pct": float(summary["loss_pct"]),
        "pacing_p99_ms": float(summary["pacing_error_ms"]["p99"]),
        # ticks the generator's own clock skipped after stalls: its callers' audio has gaps the echo check sees
        "generator_skipped": int(summary["generator"]["skipped"]),
        "audio_ok": int(summary["audio_ok"]),
        "audio_checked": int(summary["audio_checked"]),
        "targets_active": targets_active,
        "phase_s": phase_s,
        "load_1m": load_1m,
    }
    for name, cpu in helpers.items():
        row[f"{name}_us_per_call"] = net_us_per_call(cpu.cpu_s, cpu.idle_rate, phase_s, calls)
    live_call_s = window_s * sum(f["up"] for f in figures)
    for name, cpu in (helpers_window or {}).items():
        # µs per call per second it is up, net of idle: what a live call costs the process while nothing happens
        row[f"{name}_us_per_call_s"] = (
            1e6 * (cpu.cpu_s - cpu.idle_rate * window_s) / live_call_s if live_call_s > 0 else math.nan
        )
    return row


# Counts are added up over the repeats (every failed call is shown); the rest are medians.
_SUMMED = frozenset(
    {"answered", "failed", "sip_rejected", "admitted", "refused", "audio_ok", "audio_checked", "generator_skipped"}
)


def _median(values: Sequence[Any]) -> float:
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def median_row(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The repeats of one size and placement in one row: counts summed, figures (and each worker's figures)
    medians, failure statuses added up, the fewest dispatcher targets seen active."""
    if not runs:
        raise ValueError("no runs to take the median of")
    out: dict[str, Any] = {"runs": len(runs)}
    for key, first in runs[0].items():
        values = [run[key] for run in runs]
        if key in ("placement",):
            out[key] = first
        elif key == "calls":
            out[key] = int(first)
        elif key in ("statuses", "refused_by"):
            merged: dict[str, int] = {}
            for statuses in values:
                for status, count in statuses.items():
                    merged[status] = merged.get(status, 0) + count
            out[key] = merged
        elif key == "targets_active":
            seen = [v for v in values if v is not None]
            out[key] = min(seen) if seen else None
        elif isinstance(first, list):
            out[key] = [_median([v[i] for v in values]) for i in range(len(first))]
        elif key in _SUMMED:
            out[key] = sum(values)
        else:
            out[key] = _median(values)
    out["placed"] = out["calls"] * len(runs)
    return out


def compare(direct: Mapping[str, Any], kamailio: Mapping[str, Any]) -> dict[str, Any]:
    """Kamailio and two workers against one worker taken directly, at one size (medians): the ratio of CPU per
    call-frame (the workers' together, the same net of their idle CPU, and each worker's), and the setup time the
    hop added at p50/p95/p99."""
    base = float(direct["us_per_call_frame"])
    base_net = float(direct["us_per_call_frame_net"])
    out: dict[str, Any] = {
        "calls": int(direct["calls"]),
        "cpu_ratio": float(kamailio["us_per_call_frame"]) / base if base > 0 else math.nan,
        "cpu_ratio_net": float(kamailio["us_per_call_frame_net"]) / base_net if base_net > 0 else math.nan,
        "worker_cpu_ratios": [float(us) / base if base > 0 else math.nan for us in kamailio["worker_us"]],
    }
    for p in ("p50", "p95", "p99"):
        out[f"setup_{p}_added_ms"] = float(kamailio[f"setup_{p}_ms"]) - float(direct[f"setup_{p}_ms"])
    return out


def equal_per_worker(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each worker behind Kamailio against one worker taken directly *carrying as many calls*: a Kamailio size of
    2N against the direct size N, where both ran. At equal total calls the direct worker carries twice a Kamailio
    worker's calls, and the batched tick's cost per call-frame falls as its batch grows; this comparison holds the
    calls per worker, so it tells whether the per-core figures of ``gateway bench calls`` hold behind Kamailio."""
    direct = {int(r["calls"]): r for r in rows if r["placement"] == "direct"}
    out = []
    for row in rows:
        half = int(row["calls"]) // 2
        if row["placement"] != "kamailio" or int(row["calls"]) % 2 or half not in direct:
            continue
        base, base_net = float(direct[half]["us_per_call_frame"]), float(direct[half]["us_per_call_frame_net"])
        out.append(
            {
                "calls": int(row["calls"]),
                "per_worker": half,
                "landed": list(row["landed"]),
                "direct_us": base,
                "worker_us": list(row["worker_us"]),
                "ratio": float(row["us_per_call_frame"]) / base if base > 0 else math.nan,
                "ratio_net": float(row["us_per_call_frame_net"]) / base_net if base_net > 0 else math.nan,
            }
        )
    return out


def equal_per_worker_lines(pairs: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for p in pairs:
        each = " / ".join(_fmt(us) for us in p["worker_us"])
        landed = " / ".join(_fmt(n) for n in p["landed"])
        lines.append(
            f"{p['per_worker']} calls per worker: behind Kamailio ({p['calls']} calls, {landed}) {each} µs per "
            f"call-frame against {p['direct_us']:.0f} for one worker taken directly with {p['per_worker']} "
            f"({p['ratio']:.2f}x; {p['ratio_net']:.2f}x net of idle)"
        )
    return lines


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _counted(total_: Any, by: Mapping[str, int]) -> str:
    """A count and what it is made of: ``3 (503: 2, none: 1)``."""
    text = _fmt(total_)
    if by:
        text += " (" + ", ".join(f"{key}: {n}" for key, n in sorted(by.items())) + ")"
    return text


_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("calls", lambda r: _fmt(r["calls"])),
    ("load", lambda r: _fmt(r.get("load_1m"), 1)),
    ("via", lambda r: r["placement"]),
    ("calls per worker", lambda r: " / ".join(_fmt(v) for v in r["landed"])),
    ("busiest", lambda r: _fmt(r["busiest_pct"]) + " %"),
    ("µs/call/20ms per worker", lambda r: " / ".join(_fmt(v) for v in r["worker_us"])),
    ("µs/call/20ms all", lambda r: _fmt(r["us_per_call_frame"])),
    ("net of idle", lambda r: _fmt(r["us_per_call_frame_net"])),
    ("core % per worker", lambda r: " / ".join(_fmt(v) for v in r["worker_core_pct"])),
    ("overruns", lambda r: _fmt(r["overruns"])),
    ("setup p50", lambda r: _fmt(r["setup_p50_ms"], 1)),
    ("p95", lambda r: _fmt(r["setup_p95_ms"], 1)),
    ("p99", lambda r: _fmt(r["setup_p99_ms"], 1)),
    ("in worker", lambda r: _fmt(r["worker_setup_mean_ms"], 1)),
    # Kamailio only answers OPTIONS probes while the calls go direct: its figure there is the measurement's noise
    ("kamailio µs/call", lambda r: _fmt(r.get("kamailio_us_per_call")) if r["placement"] == "kamailio" else "-"),
    ("control µs/call", lambda r: _fmt(r.get("control_us_per_call"))),
    ("µs/call-s", lambda r: _fmt(r.get("control_us_per_call_s"))),
    ("redis µs/call", lambda r: _fmt(r.get("redis_us_per_call"))),
    ("failed", lambda r: _counted(r["failed"], r["statuses"])),
    ("refused", lambda r: _counted(r["refused"], r.get("refused_by", {}))),
    ("loss %", lambda r: _fmt(r["loss_pct"], 3)),
    ("echo ok", lambda r: f"{r['audio_ok']}/{r['audio_checked']}"),
    ("gen skipped", lambda r: _fmt(r["generator_skipped"])),
)


def table(rows: Sequence[Mapping[str, Any]], *, redis: bool) -> str:
    """One line per size and placement, columns aligned (the Redis column only with a Redis-backed plane)."""
    columns = [(title, cell) for title, cell in _COLUMNS if redis or title != "redis µs/call"]
    cells = [[cell(row) for _, cell in columns] for row in rows]
    widths = [max(len(title), *(len(line[i]) for line in cells)) for i, (title, _) in enumerate(columns)]
    lines = ["  ".join(title.rjust(width) for (title, _), width in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.rjust(width) for c, width in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)


def comparison_lines(comparisons: Sequence[Mapping[str, Any]], repeats: int) -> list[str]:
    """A sentence per size: the CPU ratio and the setup time the hop added."""
    lines = []
    for c in comparisons:
        per_worker = " / ".join(f"{r:.2f}x" if math.isfinite(r) else "-" for r in c["worker_cpu_ratios"])
        lines.append(
            f"{int(c['calls'])} calls: through Kamailio the workers spent {c['cpu_ratio']:.2f}x the direct worker's "
            f"CPU per call-frame (each worker: {per_worker}; {c['cpu_ratio_net']:.2f}x net of the workers' idle CPU); "
            "the hop added "
            f"{c['setup_p50_added_ms']:+.1f} / {c['setup_p95_added_ms']:+.1f} / {c['setup_p99_added_ms']:+.1f} ms "
            f"to setup p50 / p95 / p99 (medians of {repeats} interleaved runs)"
        )
    return lines
