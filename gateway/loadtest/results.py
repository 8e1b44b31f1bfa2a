"""Load-test results: one record per call, one per process run, merged and summarized for the report.

Everything here is plain data (picklable: worker processes send their :class:`RunResult` back to the parent)
and pure functions. :func:`merge` joins the runs of several worker processes onto one time axis;
:func:`aggregate` turns the calls into every figure the table, ``--json`` and the benchmark use.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gateway.loadtest.analysis import summarize
from gateway.loadtest.callanalysis import PACING_BINS, histogram_percentile


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResult:
    index: int
    worker: int
    placed_s: float  # since the run started
    outcome: str  # completed | failed | timeout | dropped | bad_answer | interrupted
    status: int | None
    reason: str = ""
    setup_ms: float | None = None
    answered_s: float | None = None
    ended_s: float | None = None
    packets_sent: int = 0
    packets_received: int = 0
    expected: int = 0
    lost: int = 0
    duplicates: int = 0
    sequence_errors: int = 0
    jitter_ms: float | None = None
    rtt_ms: tuple[float, ...] = ()
    rtt_at_s: tuple[float, ...] = ()  # since the run started
    markers_expected: int = 0
    markers_found: int = 0
    missing_markers: tuple[int, ...] = ()  # spurts (0-based) whose marker did not come back
    correlation_min: float | None = None
    audio_ok: bool | None = None
    pacing_p99_ms: float | None = None
    barge_in_stop_ms: tuple[float, ...] = ()
    dtmf_sent: int = 0
    slips: int = 0

    @property
    def answered(self) -> bool:
        return self.setup_ms is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineSample:
    t_s: float  # since the run started
    up: int  # calls with media flowing
    placed: int  # INVITEs sent so far
    failed: int  # calls ended without an answer so far
    loss_pct: float  # over the calls up at this moment
    jitter_p99_ms: float  # over the calls up at this moment


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratorStats:
    """How well the generator itself kept time (its own overload would otherwise look like target loss)."""

    ticks: int = 0
    overruns: int = 0
    skipped: int = 0
    max_lag_ms: float = 0.0
    max_tick_ms: float = 0.0
    impair: str = "none"  # the --impair-* settings applied to what the callers sent
    impair_dropped: int = 0  # packets the impairment dropped (the target saw them as lost)
    impair_delayed: int = 0  # packets it held back


@dataclass(slots=True, kw_only=True)
class RunResult:
    worker: int
    started_wall: float
    elapsed_s: float
    calls: list[CallResult]
    timeline: list[TimelineSample]
    pacing_hist: np.ndarray = field(default_factory=lambda: np.zeros(PACING_BINS, dtype=np.int64))
    # read time - kernel arrival of every received packet: the generator's own delay, not the target's
    read_delay_hist: np.ndarray = field(default_factory=lambda: np.zeros(PACING_BINS, dtype=np.int64))
    generator: GeneratorStats = field(default_factory=GeneratorStats)
    stopped_by_deadline: bool = False
    interrupted: bool = False  # stopped early by a signal (Ctrl-C, SIGTERM); the calls up were hung up


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    worker: int
    elapsed_s: float
    up: int
    placed: int
    failed: int
    cps: float
    loss_pct: float
    jitter_p99_ms: float


def merge(runs: list[RunResult]) -> RunResult:
    """One run from several workers' runs: times shifted onto the earliest start, timelines summed."""
    if len(runs) == 1:
        return runs[0]
    t0 = min(r.started_wall for r in runs)
    calls: list[CallResult] = []
    for run in runs:
        shift = run.started_wall - t0
        for c in run.calls:
            calls.append(
                _shifted(c, shift)  # indices stay per worker; (worker, index) is unique
            )
    calls.sort(key=lambda c: c.placed_s)
    timeline = _merge_timelines(runs, t0)
    hist = np.sum([r.pacing_hist for r in runs], axis=0)
    read_hist = np.sum([r.read_delay_hist for r in runs], axis=0)
    gens = [r.generator for r in runs]
    generator = GeneratorStats(
        ticks=sum(g.ticks for g in gens),
        overruns=sum(g.overruns for g in gens),
        skipped=sum(g.skipped for g in gens),
        max_lag_ms=max(g.max_lag_ms for g in gens),
        max_tick_ms=max(g.max_tick_ms for g in gens),
        impair=gens[0].impair if gens else "none",
        impair_dropped=sum(g.impair_dropped for g in gens),
        impair_delayed=sum(g.impair_delayed for g in gens),
    )
    return RunResult(
        worker=-1,
        started_wall=t0,
        elapsed_s=max(r.started_wall - t0 + r.elapsed_s for r in runs),
        calls=calls,
        timeline=timeline,
        pacing_hist=hist,
        read_delay_hist=read_hist,
        generator=generator,
        stopped_by_deadline=any(r.stopped_by_deadline for r in runs),
        interrupted=any(r.interrupted for r in runs),
    )


def _shifted(c: CallResult, shift: float) -> CallResult:
    values = asdict(c)
    values["placed_s"] = c.placed_s + shift
    for key in ("answered_s", "ended_s"):
        if values[key] is not None:
            values[key] += shift
    values["rtt_at_s"] = tuple(t + shift for t in c.rtt_at_s)
    return CallResult(**values)


def _merge_timelines(runs: list[RunResult], t0: float) -> list[TimelineSample]:
    """Sum the workers' samples per whole second (each worker samples once a second); loss and jitter: the worst."""
    buckets: dict[int, list[TimelineSample]] = {}
    for run in runs:
        shift = run.started_wall - t0
        for s in run.timeline:
            buckets.setdefault(math.floor(s.t_s + shift), []).append(s)
    out = []
    for second in sorted(buckets):
        group = buckets[second]
        out.append(
            TimelineSample(
                t_s=float(second),
                up=sum(s.up for s in group),
                placed=sum(s.placed for s in group),
                failed=sum(s.failed for s in group),
                loss_pct=max(s.loss_pct for s in group),
                jitter_p99_ms=max(s.jitter_p99_ms for s in group),
            )
        )
    return out


def _finite(values: list[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def aggregate(run: RunResult) -> dict[str, Any]:
    """Every figure of the report (JSON-ready; NaN where nothing was measured)."""
    calls = run.calls
    answered = [c for c in calls if c.answered]
    statuses = Counter(str(c.status) if c.status is not None else "none" for c in calls)
    outcomes = Counter(c.outcome for c in calls)
    expected = sum(c.expected for c in answered)
    lost = sum(c.lost for c in answered)
    checked = [c for c in answered if c.audio_ok is not None]
    rtts = [v for c in answered for v in c.rtt_ms]
    correlations = _finite([c.correlation_min for c in answered])
    max_up = max((s.up for s in run.timeline), default=0)
    return {
        "calls": len(calls),
        "answered": len(answered),
        "success_rate": len(answered) / len(calls) if calls else float("nan"),
        "completed": outcomes.get("completed", 0),
        "outcomes": dict(outcomes),
        "statuses": dict(statuses),
        "max_concurrent": max_up,
        "elapsed_s": run.elapsed_s,
        "stopped_by_deadline": run.stopped_by_deadline,
        "interrupted": run.interrupted,
        "setup_ms": summarize(_finite([c.setup_ms for c in answered])).as_dict(),
        "packets_sent": sum(c.packets_sent for c in calls),
        "packets_received": sum(c.packets_received for c in calls),
        "packets_expected": expected,
        "packets_lost": lost,
        "loss_pct": 100.0 * lost / expected if expected else float("nan"),
        "calls_with_loss": sum(1 for c in answered if c.lost),
        "duplicates": sum(c.duplicates for c in answered),
        "sequence_errors": sum(c.sequence_errors for c in answered),
        "jitter_ms": summarize(_finite([c.jitter_ms for c in answered])).as_dict(),
        "pacing_error_ms": {
            "packets": int(run.pacing_hist.sum()),
            "p50": histogram_percentile(run.pacing_hist, 50),
            "p90": histogram_percentile(run.pacing_hist, 90),
            "p99": histogram_percentile(run.pacing_hist, 99),
            "p999": histogram_percentile(run.pacing_hist, 99.9),
        },
        # how long received packets waited for the generator to read them (not counted in the pacing error)
        "read_delay_ms": {
            "packets": int(run.read_delay_hist.sum()),
            "p50": histogram_percentile(run.read_delay_hist, 50),
            "p99": histogram_percentile(run.read_delay_hist, 99),
            "p999": histogram_percentile(run.read_delay_hist, 99.9),
        },
        "rtt_ms": summarize(rtts).as_dict(),
        "markers_expected": sum(c.markers_expected for c in answered),
        "markers_found": sum(c.markers_found for c in answered),
        "calls_with_all_markers": sum(1 for c in answered if c.markers_found == c.markers_expected),
        "audio_checked": len(checked),
        "audio_ok": sum(1 for c in checked if c.audio_ok),
        "correlation_min": summarize(correlations).as_dict(),
        "slips": sum(c.slips for c in answered),
        "barge_in_stop_ms": summarize([v for c in answered for v in c.barge_in_stop_ms]).as_dict(),
        "dtmf_sent": sum(c.dtmf_sent for c in answered),
        "generator": asdict(run.generator),
    }


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def table(summary: dict[str, Any]) -> str:
    """The final human-readable table."""
    rows: list[tuple[str, str]] = []
    if summary.get("interrupted"):
        rows.append(("interrupted", f"after {_fmt(summary['elapsed_s'])} s; the calls up were hung up"))
    rate = summary["success_rate"]
    rows.append(("calls answered", f"{summary['answered']}/{summary['calls']} ({_fmt(100 * rate)} %)"))
    failures = {k: v for k, v in summary["statuses"].items() if k != "200"}
    if failures:
        rows.append(("failures by status", ", ".join(f"{k}: {v}" for k, v in sorted(failures.items()))))
    rows.append(("outcomes", ", ".join(f"{k}: {v}" for k, v in sorted(summary["outcomes"].items()))))
    rows.append(("max concurrent", str(summary["max_concurrent"])))
    for key, label in (("setup_ms", "setup ms"), ("jitter_ms", "jitter ms"), ("rtt_ms", "round trip ms")):
        s = summary[key]
        rows.append((label, f"p50 {_fmt(s['p50'])}  p90 {_fmt(s['p90'])}  p99 {_fmt(s['p99'])}  max {_fmt(s['max'])}"))
    p = summary["pacing_error_ms"]
    rows.append(("pacing error ms", f"p50 {_fmt(p['p50'], 2)}  p99 {_fmt(p['p99'], 2)}  p99.9 {_fmt(p['p999'], 2)}"))
    r = summary["read_delay_ms"]
    if r["packets"]:
        rows.append(
            ("generator read delay ms", f"p50 {_fmt(r['p50'], 2)}  p99 {_fmt(r['p99'], 2)}  p99.9 {_fmt(r['p999'], 2)}")
        )
    rows.append(
        (
            "RTP packets",
            f"sent {summary['packets_sent']}  received {summary['packets_received']}  "
            f"lost {summary['packets_lost']} ({_fmt(summary['loss_pct'], 3)} %)  "
            f"seq errors {summary['sequence_errors']}",
        )
    )
    rows.append(("markers found", f"{summary['markers_found']}/{summary['markers_expected']}"))
    rows.append(
        (
            "audio came back right",
            f"{summary['audio_ok']}/{summary['audio_checked']} calls "
            f"(min correlation p50 {_fmt(summary['correlation_min']['p50'], 3)}; slips {summary['slips']})",
        )
    )
    if summary["barge_in_stop_ms"]["count"]:
        s = summary["barge_in_stop_ms"]
        rows.append(("barge-in stop ms", f"p50 {_fmt(s['p50'])}  p99 {_fmt(s['p99'])}"))
    if summary["dtmf_sent"]:
        rows.append(("DTMF digits sent", str(summary["dtmf_sent"])))
    g = summary["generator"]
    rows.append(
        (
            "generator",
            f"ticks {g['ticks']}  overruns {g['overruns']}  skipped {g['skipped']}  max lag {_fmt(g['max_lag_ms'])} ms",
        )
    )
    if g["impair"] != "none":
        rows.append(
            (
                "impairment (sent)",
                f"{g['impair']}: {g['impair_dropped']} packets dropped, {g['impair_delayed']} held back",
            )
        )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def progress_line(parts: list[Progress]) -> str:
    up = sum(p.up for p in parts)
    placed = sum(p.placed for p in parts)
    failed = sum(p.failed for p in parts)
    cps = sum(p.cps for p in parts)
    loss = max((p.loss_pct for p in parts), default=0.0)
    jitter = max((p.jitter_p99_ms for p in parts), default=0.0)
    elapsed = max((p.elapsed_s for p in parts), default=0.0)
    return (
        f"{elapsed:6.1f}s  up {up:5d}  placed {placed:6d}  failed {failed:4d}  "
        f"cps {cps:6.1f}  loss {loss:6.3f}%  jitter p99 {jitter:5.1f} ms"
    )
