"""The figures of ``gateway bench cluster``: expositions read, a phase's row built, repeats and placements compared."""

from __future__ import annotations

import math

import pytest

from bench.cluster_figures import (
    PhaseCpu,
    WorkerWindow,
    compare,
    comparison_lines,
    equal_per_worker,
    equal_per_worker_lines,
    growth,
    median_row,
    net_us_per_call,
    parse_samples,
    percentiles,
    phase_row,
    table,
    total,
    us_per_call_frame,
)

EXPOSITION = """# HELP gateway_calls_total Calls ended, by end reason
# TYPE gateway_calls_total counter
gateway_calls_total{end_reason="remote_bye",worker="w1"} 7.0
gateway_calls_total{end_reason="timeout",worker="w1"} 1.0
gateway_calls_total{end_reason="remote_bye",worker="w2"} 3.0
# HELP gateway_active_calls Live calls
# TYPE gateway_active_calls gauge
gateway_active_calls{worker="w1"} 4.0
"""


def test_an_exposition_is_read_by_name_and_labels() -> None:
    samples = parse_samples(EXPOSITION)
    assert total(samples, "gateway_calls_total") == 11
    assert total(samples, "gateway_calls_total", worker="w1") == 8
    assert total(samples, "gateway_calls_total", worker="w1", end_reason="timeout") == 1
    assert total(samples, "gateway_calls_total", worker="w3") == 0
    assert total(samples, "gateway_active_calls", worker="w1") == 4
    later = parse_samples(EXPOSITION.replace("} 7.0", "} 10.0"))
    assert growth(samples, later, "gateway_calls_total", worker="w1") == 3
    assert growth(samples, later, "gateway_calls_total", worker="w2") == 0


def test_percentiles_of_setup_times_skip_unanswered_calls() -> None:
    values: list[float | None] = [float(v) for v in range(1, 101)]
    values += [None, math.nan]
    got = percentiles(values)
    assert got["p50"] == pytest.approx(50.5)
    assert got["p95"] == pytest.approx(95.05)
    assert got["p99"] == pytest.approx(99.01)
    assert got["max"] == 100
    assert all(math.isnan(v) for v in percentiles([None]).values())


def test_cpu_per_call_frame_and_per_call() -> None:
    # Half a second of CPU over a 10 s window carrying 50 calls: 1 ms per 20 ms frame over 50 calls = 20 µs.
    assert us_per_call_frame(0.5, 10.0, 50) == pytest.approx(20.0)
    assert math.isnan(us_per_call_frame(0.5, 10.0, 0))
    # 0.3 s over a 20 s phase, 0.005 s/s of it idle (0.1 s), over 100 calls: 2 ms each.
    assert net_us_per_call(0.3, 0.005, 20.0, 100) == pytest.approx(2000.0)
    assert math.isnan(net_us_per_call(0.3, 0.0, 20.0, 0))


def _worker(wid: str, *, landed: int, up: int, cpu_s: float, overruns: int = 0) -> WorkerWindow:
    start = parse_samples(
        f'gateway_call_setup_seconds_count{{worker="{wid}"}} 5\n'
        f'gateway_call_setup_seconds_sum{{worker="{wid}"}} 0.05\n'
        f'gateway_tick_overruns_total{{worker="{wid}"}} 2\n'
        f'gateway_sip_rejected_total{{worker="{wid}",reason="parse"}} 1\n'
    )
    window = parse_samples(
        f'gateway_active_calls{{worker="{wid}"}} {up}\ngateway_tick_overruns_total{{worker="{wid}"}} 2\n'
    )
    closing = parse_samples(
        f'gateway_active_calls{{worker="{wid}"}} {up}\ngateway_tick_overruns_total{{worker="{wid}"}} {2 + overruns}\n'
    )
    end = parse_samples(
        f'gateway_call_setup_seconds_count{{worker="{wid}"}} {5 + landed}\n'
        f'gateway_call_setup_seconds_sum{{worker="{wid}"}} {0.05 + 0.004 * landed}\n'
        f'gateway_sip_rejected_total{{worker="{wid}",reason="parse"}} 1\n'
    )
    return WorkerWindow(
        worker_id=wid,
        start=start,
        window_open=window,
        window_close=closing,
        end=end,
        cpu_open_s=1.0,
        cpu_close_s=1.0 + cpu_s,
    )


SUMMARY = {
    "answered": 58,
    "statuses": {"200": 58, "503": 2},
    "loss_pct": 0.0,
    "pacing_error_ms": {"p99": 2.5},
    "audio_ok": 57,
    "audio_checked": 58,
    "generator": {"skipped": 3},
}
ADMISSIONS_BEFORE = parse_samples('gateway_admissions_total{outcome="accepted"} 10\n')
ADMISSIONS_AFTER = parse_samples(
    'gateway_admissions_total{outcome="accepted"} 68\ngateway_admissions_total{outcome="over_capacity"} 2\n'
)


def _row(placement: str, workers: list[WorkerWindow], setup: list[float | None]) -> dict[str, object]:
    return phase_row(
        placement=placement,
        calls=60,
        summary=SUMMARY,
        setup_ms=setup,
        workers=workers,
        window_s=10.0,
        phase_s=30.0,
        helpers={"kamailio": PhaseCpu(cpu_s=0.06, idle_rate=0.001), "control": PhaseCpu(cpu_s=0.9, idle_rate=0.01)},
        control_before=ADMISSIONS_BEFORE,
        control_after=ADMISSIONS_AFTER,
        targets_active=2 if placement == "kamailio" else None,
        worker_idle_rates=[0.01, 0.02],
        helpers_window={"control": PhaseCpu(cpu_s=0.2, idle_rate=0.01)},
        load_1m=2.5,
    )


def test_a_phase_row_through_kamailio_spreads_and_prices_each_worker() -> None:
    workers = [_worker("w1", landed=31, up=30, cpu_s=0.9, overruns=1), _worker("w2", landed=27, up=28, cpu_s=0.7)]
    row = _row("kamailio", workers, [10.0, 12.0, None, 14.0])
    assert row["landed"] == [31, 27] and row["busiest_pct"] == pytest.approx(100 * 31 / 58)
    assert row["worker_us"] == pytest.approx([0.9 / 10 * 0.02 / 30 * 1e6, 0.7 / 10 * 0.02 / 28 * 1e6])
    assert row["us_per_call_frame"] == pytest.approx(1.6 / 10 * 0.02 / 58 * 1e6)
    # less 1 % and 2 % of a core idle over the 10 s window: 0.1 s and 0.2 s
    assert row["us_per_call_frame_net"] == pytest.approx(1.3 / 10 * 0.02 / 58 * 1e6)
    assert row["worker_core_pct"] == pytest.approx([9.0, 7.0])
    assert row["overruns"] == 1 and row["sip_rejected"] == 0  # growth only: the earlier rejection is not this phase's
    assert (row["answered"], row["failed"], row["statuses"]) == (58, 2, {"503": 2})
    assert (row["admitted"], row["refused"], row["refused_by"]) == (58, 2, {"over_capacity": 2})
    assert row["setup_p50_ms"] == pytest.approx(12.0) and row["setup_max_ms"] == 14.0
    assert row["worker_setup_mean_ms"] == pytest.approx(4.0)
    assert row["kamailio_us_per_call"] == pytest.approx(1e6 * (0.06 - 0.03) / 60)
    assert row["control_us_per_call"] == pytest.approx(1e6 * (0.9 - 0.3) / 60)
    assert row["targets_active"] == 2 and row["load_1m"] == 2.5 and row["generator_skipped"] == 3
    # over the 10 s window with 58 calls up: 0.2 s less 0.1 s idle over 580 call-seconds
    assert row["control_us_per_call_s"] == pytest.approx(1e6 * 0.1 / 580)


def test_a_direct_phase_prices_the_carrying_worker_alone() -> None:
    """The idle second worker's own CPU (heartbeats, its clock) is not charged to the direct worker's calls."""
    workers = [_worker("w1", landed=58, up=58, cpu_s=1.5), _worker("w2", landed=0, up=0, cpu_s=0.1)]
    row = _row("direct", workers, [5.0])
    assert row["landed"] == [58, 0] and row["busiest_pct"] == 100
    assert row["us_per_call_frame"] == pytest.approx(row["worker_us"][0])  # type: ignore[index]
    assert row["us_per_call_frame_net"] == pytest.approx(1.4 / 10 * 0.02 / 58 * 1e6)  # the first worker's idle only
    assert math.isnan(row["worker_us"][1])  # type: ignore[index]


def _phase(placement: str, *, us: float, setup: float, failed: int, statuses: dict[str, int]) -> dict[str, object]:
    return {
        "calls": 100,
        "placement": placement,
        "answered": 100 - failed,
        "failed": failed,
        "statuses": statuses,
        "refused_by": dict(statuses),
        "landed": [50.0, 50.0],
        "worker_us": [us, us + 2],
        "us_per_call_frame": us + 1,
        "us_per_call_frame_net": us - 4,
        "setup_p50_ms": setup,
        "setup_p95_ms": setup * 2,
        "setup_p99_ms": setup * 3,
        "audio_ok": 100 - failed,
        "audio_checked": 100 - failed,
        "loss_pct": math.nan,
        "targets_active": 2,
        "generator_skipped": 1,
    }


def test_repeats_are_medians_and_their_failures_are_added_up() -> None:
    runs = [
        _phase("kamailio", us=40, setup=10, failed=0, statuses={}),
        _phase("kamailio", us=60, setup=30, failed=1, statuses={"503": 1}),
        _phase("kamailio", us=50, setup=20, failed=2, statuses={"503": 1, "408": 1}),
    ]
    runs[2]["targets_active"] = 1
    row = median_row(runs)
    assert (row["runs"], row["placed"], row["calls"], row["placement"]) == (3, 300, 100, "kamailio")
    assert row["worker_us"] == [50, 52] and row["us_per_call_frame"] == 51
    assert row["setup_p99_ms"] == 60
    assert (row["failed"], row["answered"], row["audio_ok"]) == (3, 297, 297)
    assert row["statuses"] == row["refused_by"] == {"503": 2, "408": 1}
    assert row["targets_active"] == 1  # the fewest seen
    assert math.isnan(row["loss_pct"])
    with pytest.raises(ValueError, match="no runs"):
        median_row([])


def test_the_placements_are_compared_size_by_size() -> None:
    direct = median_row([_phase("direct", us=40, setup=6, failed=0, statuses={})])
    through = median_row([_phase("kamailio", us=45, setup=9, failed=0, statuses={})])
    direct["us_per_call_frame"] = 40.0
    got = compare(direct, through)
    assert got["calls"] == 100
    assert got["cpu_ratio"] == pytest.approx(46 / 40)
    assert got["worker_cpu_ratios"] == pytest.approx([45 / 40, 47 / 40])
    assert (got["setup_p50_added_ms"], got["setup_p95_added_ms"], got["setup_p99_added_ms"]) == (3, 6, 9)
    [line] = comparison_lines([got], repeats=3)
    assert got["cpu_ratio_net"] == pytest.approx(41 / 36)
    assert "1.15x the direct worker's CPU per call-frame (each worker: 1.12x / 1.18x; 1.14x net of" in line
    assert "+3.0 / +6.0 / +9.0 ms to setup p50 / p95 / p99 (medians of 3 interleaved runs)" in line


def test_the_table_shows_each_placement_and_blanks_what_does_not_apply() -> None:
    rows = []
    for placement in ("direct", "kamailio"):
        row = median_row([_phase(placement, us=40, setup=6, failed=1, statuses={"503": 1})])
        row |= {
            "busiest_pct": 50.0,
            "worker_core_pct": [40.0, 41.0],
            "overruns": 0.0,
            "worker_setup_mean_ms": 4.2,
            "refused": 0.0,
            "kamailio_us_per_call": 123.0,
            "control_us_per_call": 2345.0,
            "redis_us_per_call": 88.0,
        }
        rows.append(row)
    text = table(rows, redis=False)
    header, direct, through = text.splitlines()
    assert "µs/call/20ms per worker" in header and "redis" not in header
    assert header.index("kamailio µs/call") > 0
    assert "40 / 42" in direct and "1 (503: 1)" in direct and "99/99" in direct
    assert "123" not in direct and "123" in through  # Kamailio is not in a direct call's path
    assert "redis µs/call" in table(rows, redis=True)


def test_each_worker_behind_kamailio_is_set_against_a_direct_worker_carrying_as_many_calls() -> None:
    rows = []
    for calls, placement, us in (
        (50, "direct", 70.0),
        (50, "kamailio", 90.0),
        (100, "direct", 50.0),
        (100, "kamailio", 63.0),
    ):
        row = _phase(placement, us=us, setup=6, failed=0, statuses={})
        row |= {"calls": calls, "us_per_call_frame": us, "us_per_call_frame_net": us - 7, "landed": [calls / 2] * 2}
        rows.append(row)
    rows.append(_phase("kamailio", us=40, setup=6, failed=0, statuses={}) | {"calls": 301})  # no direct half
    [pair] = equal_per_worker(rows)
    assert (pair["calls"], pair["per_worker"], pair["direct_us"]) == (100, 50, 70.0)
    assert pair["ratio"] == pytest.approx(63 / 70) and pair["ratio_net"] == pytest.approx(56 / 63)
    [line] = equal_per_worker_lines([pair])
    assert line.startswith("50 calls per worker: behind Kamailio (100 calls, 50 / 50) 63 / 65 µs per call-frame")
    assert "against 70 for one worker taken directly with 50 (0.90x; 0.89x net of idle)" in line
