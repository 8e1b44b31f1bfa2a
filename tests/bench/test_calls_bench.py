"""The pure parts of ``gateway bench calls``: metrics deltas, medians, the headline, the profile categories."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from bench._profile import categorize
from bench.calls import _bucket_p99, _collector_passes, _counter, _median_row, _parse_metrics, headline

BEFORE = """
# HELP gateway_tick_seconds Work done in one 20 ms media tick
gateway_tick_seconds_bucket{le="0.001",worker="bench"} 10.0
gateway_tick_seconds_bucket{le="0.002",worker="bench"} 10.0
gateway_tick_seconds_bucket{le="0.004",worker="bench"} 10.0
gateway_tick_seconds_bucket{le="+Inf",worker="bench"} 10.0
gateway_tick_seconds_sum{worker="bench"} 0.005
gateway_tick_overruns_total{worker="bench"} 2.0
gateway_ticks_skipped_total{worker="bench"} 4.0
gateway_active_calls{worker="bench"} 0.0
"""
AFTER = """
gateway_tick_seconds_bucket{le="0.001",worker="bench"} 500.0
gateway_tick_seconds_bucket{le="0.002",worker="bench"} 1000.0
gateway_tick_seconds_bucket{le="0.004",worker="bench"} 1009.0
gateway_tick_seconds_bucket{le="+Inf",worker="bench"} 1010.0
gateway_tick_seconds_sum{worker="bench"} 1.505
gateway_tick_overruns_total{worker="bench"} 3.0
gateway_ticks_skipped_total{worker="bench"} 10.0
gateway_active_calls{worker="bench"} 100.0
"""


def test_tick_p99_and_overruns_come_from_deltas_over_the_window() -> None:
    before, after = _parse_metrics(BEFORE), _parse_metrics(AFTER)
    p99, count, mean = _bucket_p99(before, after, "gateway_tick_seconds")
    assert count == 1000
    assert p99 == 2.0  # 990 of the 1000 window ticks took <= 2 ms
    assert math.isclose(mean, 1.5)
    assert _counter(before, after, "gateway_tick_overruns_total") == 1.0
    assert _counter(before, after, "gateway_ticks_skipped_total") == 6.0


def test_the_gateway_added_delays_are_read_from_the_workers_own_histograms() -> None:
    # A real exposition of the two histograms, as the worker serves it
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    waits = [
        Histogram(name, "", ["worker"], buckets=(0.02, 0.04, 0.06), registry=registry).labels("bench")
        for name in ("gateway_caller_audio_wait_seconds", "gateway_agent_audio_wait_seconds")
    ]
    before = _parse_metrics(generate_latest(registry).decode())
    for seconds in (0.03, 0.03, 0.05):
        waits[0].observe(seconds)
    waits[1].observe(0.01)
    after = _parse_metrics(generate_latest(registry).decode())
    p99, count, mean = _bucket_p99(before, after, "gateway_caller_audio_wait_seconds")
    assert (p99, count) == (60.0, 3) and math.isclose(mean, 110 / 3)
    assert _bucket_p99(before, after, "gateway_agent_audio_wait_seconds")[:2] == (20.0, 1)


def test_playout_events_are_read_by_event_from_the_workers_counters() -> None:
    from gateway.observability import PLAYOUT_EVENTS_TOTAL, REGISTRY

    events = {e: PLAYOUT_EVENTS_TOTAL.labels("bench-playout", e) for e in ("underrun", "discarded", "concealed")}
    before = _parse_metrics(generate_latest(REGISTRY).decode())
    events["underrun"].inc(2)
    events["discarded"].inc(5)
    events["concealed"].inc(7)
    after = _parse_metrics(generate_latest(REGISTRY).decode())
    assert _counter(before, after, "gateway_playout_events_total", 'event="underrun"') == 2
    assert _counter(before, after, "gateway_playout_events_total", 'event="discarded"') == 5


def test_medians_of_repeats_and_a_majority_verdict() -> None:
    runs = [
        {"calls": 400, "loss_pct": 0.0, "tick_p99_ms": 4.0, "sustained": True, "markers": "1/1", "audio_failures": []},
        {
            "calls": 400,
            "loss_pct": 0.1,
            "tick_p99_ms": 6.0,
            "sustained": False,
            "markers": "1/1",
            "audio_failures": ["a"],
        },
        {
            "calls": 400,
            "loss_pct": 0.0,
            "tick_p99_ms": math.nan,
            "sustained": True,
            "markers": "1/1",
            "audio_failures": ["b"],
        },
    ]
    row = _median_row(runs)
    assert row["loss_pct"] == 0.0 and row["tick_p99_ms"] == 5.0
    assert row["audio_failures"] == ["a", "b"]  # every run's, not the first run's
    assert row["sustained"] is True and row["sustained_runs"] == 2 and row["runs"] == 3
    rows = [row, {**row, "calls": 600, "sustained": False}, {**row, "calls": 200}]
    assert headline(rows) == 400
    assert headline([{**row, "sustained": False}]) == 0


def test_profile_samples_go_to_the_innermost_known_category() -> None:
    lines = [
        "run (asyncio/runners.py:1);_fire (gateway/transport/clock.py:83);tick_inbound (gateway/media/tick.py:244) 30",
        "run (asyncio/runners.py:118);send_audio (gateway/providers/openai.py:258);b64encode (base64.py:58) 5",
        "run (asyncio/runners.py:118);send (gateway/providers/_link.py:148);send_data (websockets/asyncio/x.py:1) 7",
        "run (asyncio/runners.py:118);__call__ (gateway/transport/rtp_socket.py:64) 11",
        "idle 3",
    ]
    totals = categorize(lines)
    assert totals == {
        "tick DSP": 30,
        "JSON/base64": 5,
        "websocket send/recv": 7,
        "RTP I/O": 11,
        "other": 3,
    }


PERF_SCRIPT = """
\t    ffffffff81 udp_sendmsg ([kernel.kallsyms])
\t    ffffffff82 __sys_sendto ([kernel.kallsyms])
\t         e1 sock_sendto (/usr/lib/python3.11/lib-dynload/_socket.cpython-311-x86_64-linux-gnu.so)
\t         e2 CPyDef_rtp_socket___RtpEndpoint____send (/b/gateway/_compiled__mypyc.so)
\t         e3 CPyDef_worker___MediaWorker____on_tick (/b/gateway/_compiled__mypyc.so)

\t         a1 dgemm_kernel_HASWELL (/v/numpy.libs/libscipy_openblas64_-32a4b2a6.so)
\t         a2 _PyEval_EvalFrameDefault (/lib/libpython3.11.so.1.0)
\t         a3 CPyDef_tick___TickEngine____inbound_g711 (/b/gateway/_compiled__mypyc.so)

\t         b1 _Py_dict_lookup (/lib/libpython3.11.so.1.0)
\t         b2 CPyDef_session___CallSession___pull_outbound (/b/gateway/_compiled__mypyc.so)
\t         b3 CPyDef_worker___MediaWorker____on_tick (/b/gateway/_compiled__mypyc.so)

\t         c1 _PyEval_EvalFrameDefault (/lib/libpython3.11.so.1.0)
\t         c2 __pyx_f_6uvloop_4loop_6Handle__run (/v/uvloop/loop.cpython-311-x86_64-linux-gnu.so)

\t         d1 __pyx_f_6uvloop_4loop___on_uvpoll_event (/v/uvloop/loop.cpython-311-x86_64-linux-gnu.so)

\t    ffffffff83 handle_softirqs ([kernel.kallsyms])
\t    ffffffff84 asm_sysvec_apic_timer_interrupt ([kernel.kallsyms])
\t         f1 CPyDef_jitter___JitterBuffer___pop (inlined) (/b/gateway/_compiled__mypyc.so)

\t    ffffffff85 tcp_sendmsg ([kernel.kallsyms])
\t    ffffffff86 ksys_write ([kernel.kallsyms])
\t         g1 CPyDef__link___ProviderLink___send_nowait (/b/gateway/_compiled__mypyc.so)
"""


def test_perf_samples_go_to_their_system_call_or_their_innermost_compiled_module() -> None:
    from bench._profile import INTERPRETED, categorize_perf, perf_samples

    samples = perf_samples(PERF_SCRIPT)
    assert [len(s) for s in samples] == [5, 3, 3, 2, 1, 3, 3]
    assert samples[5][2] == ("CPyDef_jitter___JitterBuffer___pop", "/b/gateway/_compiled__mypyc.so")
    assert categorize_perf(samples) == {
        "RTP I/O: UDP system calls": 1,
        "DSP and arrays (numpy/BLAS)": 1,  # BLAS under the tick: the library doing the work
        "session and provider adapter": 1,  # the interpreter's dict lookup is the compiled caller's cost
        INTERPRETED: 1,  # Python code the loop called is not the loop's time
        "event loop": 1,
        "kernel, other (interrupts, scheduler, page faults)": 1,
        "provider socket: TCP system calls": 1,
    }


def test_steal_time_is_read_per_core_and_an_unknown_core_reads_as_unknown() -> None:
    import os

    from bench.calls import _steal_s

    assert _steal_s(os.cpu_count() or 1) is None  # no such core
    if os.path.exists("/proc/stat"):
        first = _steal_s(0)
        assert first is not None and first >= 0.0 and (_steal_s(0) or 0.0) >= first
        assert (_steal_s(None) or 0.0) >= 0.0


def test_against_source_runs_the_source_worker_then_the_compiled_one() -> None:
    from bench.calls import CallsBenchConfig, _variants

    both = _variants(CallsBenchConfig(compiled="build/compiled", against_source=True))
    assert [(label, c.compiled) for label, c in both] == [("source", None), ("compiled", "build/compiled")]
    assert [label for label, _ in _variants(CallsBenchConfig(compiled="build/compiled"))] == ["compiled"]
    assert [label for label, _ in _variants(CallsBenchConfig())] == ["source"]


def test_the_ratio_pairs_the_steps_both_workers_ran() -> None:
    from bench.calls import _ratios

    rows = {
        "source": [{"calls": 50, "cpu_us_per_call_frame": 140.0}, {"calls": 100, "cpu_us_per_call_frame": 130.0}],
        "compiled": [{"calls": 100, "cpu_us_per_call_frame": 104.0}],
    }
    assert _ratios(rows) == [(100, 130.0, 104.0)]
    assert _ratios({"source": rows["source"]}) == []


def test_opus_calls_moved_ahead_and_back_are_read_from_the_workers_counter() -> None:
    from gateway.observability import OPUS_ENCODE_MOVES_TOTAL, REGISTRY

    before = _parse_metrics(generate_latest(REGISTRY).decode())
    OPUS_ENCODE_MOVES_TOTAL.labels("bench-opus", "ahead").inc(30)
    OPUS_ENCODE_MOVES_TOTAL.labels("bench-opus", "inline").inc(4)
    after = _parse_metrics(generate_latest(REGISTRY).decode())
    assert _counter(before, after, "gateway_opus_encode_moves_total", 'to="ahead"') == 30
    assert _counter(before, after, "gateway_opus_encode_moves_total", 'to="inline"') == 4


def test_the_workers_collector_passes_are_read_from_its_histogram() -> None:
    from gateway.observability import GC_PAUSE_SECONDS, REGISTRY

    before = _parse_metrics(generate_latest(REGISTRY).decode())
    for seconds in (0.002, 0.003, 0.004):
        GC_PAUSE_SECONDS.labels("1", "other").observe(seconds)
    GC_PAUSE_SECONDS.labels("0", "other").observe(0.0005)  # young passes are not counted
    GC_PAUSE_SECONDS.labels("2", "tick").observe(0.05)
    after = _parse_metrics(generate_latest(REGISTRY).decode())
    passes = _collector_passes(before, after)
    assert passes["gc_middle_passes"] == 3 and passes["gc_full_passes"] == 1
    assert passes["gc_middle_mean_ms"] == pytest.approx(3.0)
    assert _collector_passes(after, after) == {"gc_middle_passes": 0, "gc_middle_mean_ms": 0.0, "gc_full_passes": 0}


def test_srtp_runs_the_calls_over_plain_rtp_then_over_srtp_on_the_same_build() -> None:
    from bench.calls import CallsBenchConfig, _ratios, _variants

    both = _variants(CallsBenchConfig(compiled="build/compiled", srtp="AES_CM_128_HMAC_SHA1_32"))
    assert [(label, c.compiled, c.calls_srtp) for label, c in both] == [
        ("plain RTP", "build/compiled", None),
        ("SRTP", "build/compiled", "AES_CM_128_HMAC_SHA1_32"),
    ]
    rows = {
        "plain RTP": [{"calls": 100, "cpu_us_per_call_frame": 80.0}],
        "SRTP": [{"calls": 100, "cpu_us_per_call_frame": 86.0}],
    }
    assert _ratios(rows, base="plain RTP", other="SRTP") == [(100, 80.0, 86.0)]
    assert _ratios(rows) == []
