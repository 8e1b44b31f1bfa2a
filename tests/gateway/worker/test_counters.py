"""The worker's counter export: per-call running totals become Prometheus counter growth, to the last frame."""

from __future__ import annotations

from gateway.media.call import MediaCall, MediaCallConfig
from gateway.media.rtp import RtpPacket
from gateway.observability import REGISTRY
from gateway.worker.counters import CallFigures, CounterExporter, call_figures, live_call_figures, session_figures


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_call_totals_grow_the_counters_and_a_calls_last_growth_is_not_lost_when_it_ends() -> None:
    worker = "w-counters-test"
    exporter = CounterExporter(worker)
    exporter.calls([CallFigures("a", 2, 1.5, 3, 1, 0, 0), CallFigures("b", 0, 0.5, 0, 0, 0, 1)])
    exporter.calls([CallFigures("a", 2, 1.5, 5, 1, 1, 0), CallFigures("b", 1, 0.5, 0, 0, 0, 1)])
    # "a" ends between two exports, after two more concealed frames and a second underrun
    exporter.call_ended("a", CallFigures("a", 2, 1.5, 7, 2, 1, 0, inserted=1))
    exporter.call_ended("c", None)  # refused before media: nothing to add
    assert value("gateway_rtp_lost_total", worker=worker) == 3
    assert value("gateway_playout_events_total", worker=worker, event="concealed") == 7
    assert value("gateway_playout_events_total", worker=worker, event="underrun") == 2
    assert value("gateway_playout_events_total", worker=worker, event="discarded") == 1
    assert value("gateway_playout_events_total", worker=worker, event="inserted") == 1
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


def test_a_live_calls_figures_are_those_of_its_media_stats() -> None:
    """The once-a-second export reads five counters off the call; they must be the MediaStats ones."""
    call = MediaCall(
        MediaCallConfig(
            call_id="c1",
            codec="PCMU",
            payload_type=0,
            telephone_event_pt=101,
            remote_rtp=("127.0.0.1", 40000),
            ssrc=0xCAFE,
            initial_sequence=1,
            initial_timestamp=0,
        ),
        now=0.0,
    )
    for seq in (1, 2, 5, 4, 9):  # losses, a reorder and gaps the jitter buffer conceals and counts
        call.receive(RtpPacket(False, 0, seq, seq * 160 + seq % 3, 42, b"\xff" * 160), ("127.0.0.1", 40000), seq * 0.02)
    for _ in range(12):
        call.jitter_buffer.pop()
    live = live_call_figures("c1", call, agent_audio_gaps=4)
    assert live == call_figures("c1", call.stats(1.0), agent_audio_gaps=4)
    assert live.lost > 0 and live.jitter_ms and live.concealed + live.underruns > 0
