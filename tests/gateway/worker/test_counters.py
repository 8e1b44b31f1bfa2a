"""The worker's counter export: per-call running totals become Prometheus counter growth, to the last frame."""

from __future__ import annotations

from gateway.observability import REGISTRY
from gateway.worker.counters import CallFigures, CounterExporter, session_figures


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_call_totals_grow_the_counters_and_a_calls_last_growth_is_not_lost_when_it_ends() -> None:
    worker = "w-counters-test"
    exporter = CounterExporter(worker)
    exporter.calls([CallFigures("a", 2, 1.5, 3, 1, 0, 0), CallFigures("b", 0, 0.5, 0, 0, 0, 1)])
    exporter.calls([CallFigures("a", 2, 1.5, 5, 1, 1, 0), CallFigures("b", 1, 0.5, 0, 0, 0, 1)])
    # "a" ends between two exports, after two more concealed frames and a second underrun
    exporter.call_ended("a", CallFigures("a", 2, 1.5, 7, 2, 1, 0))
    exporter.call_ended("c", None)  # refused before media: nothing to add
    assert value("gateway_rtp_lost_total", worker=worker) == 3
    assert value("gateway_playout_events_total", worker=worker, event="concealed") == 7
    assert value("gateway_playout_events_total", worker=worker, event="underrun") == 2
    assert value("gateway_playout_events_total", worker=worker, event="discarded") == 1
    assert value("gateway_agent_audio_gaps_total", worker=worker) == 1
    # a new call reusing the id starts from zero, not from the ended call's totals
    exporter.calls([CallFigures("a", 0, 0.0, 1, 0, 0, 0)])
    assert value("gateway_playout_events_total", worker=worker, event="concealed") == 8


def test_a_browser_call_exports_its_sessions_gaps_and_no_jitter_sample() -> None:
    worker = "w-counters-browser"
    exporter = CounterExporter(worker)
    samples = value("gateway_rtp_jitter_ms_count", worker=worker)
    exporter.calls([session_figures("b1", agent_audio_gaps=2)])
    exporter.call_ended("b1", session_figures("b1", agent_audio_gaps=3))
    assert value("gateway_agent_audio_gaps_total", worker=worker) == 3
    assert value("gateway_rtp_jitter_ms_count", worker=worker) == samples  # aiortc measures its jitter, not us
    assert value("gateway_playout_events_total", worker=worker, event="concealed") == 0
