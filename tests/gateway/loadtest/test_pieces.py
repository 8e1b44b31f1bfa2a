"""Unit tests of the load generator's pure pieces: config bounds, send schedule, plans, analysis, merging."""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.loadtest import _codec
from gateway.loadtest.analysis import chirp, find_marker
from gateway.loadtest.audio import (
    MARKER_MS,
    PAUSE_CAP_MS,
    cap_pauses,
    plan_call_audio,
    silent_call_reason,
    source_audio,
    speech_like,
)
from gateway.loadtest.callanalysis import (
    PACING_BINS,
    analyze_call,
    histogram_percentile,
    pacing_histogram,
)
from gateway.loadtest.config import (
    Codec,
    LoadConfig,
    LoadConfigError,
    TalkPattern,
    TargetNotAllowedError,
    check_target,
    parse_target,
)
from gateway.loadtest.media import CallReceiver, CallSender, FrameSchedule
from gateway.loadtest.results import CallResult, RunResult, TimelineSample, aggregate, merge

# ----------------------------------------------------------------------------------------- bounds


def test_non_loopback_targets_are_refused_unless_allowed() -> None:
    with pytest.raises(TargetNotAllowedError):
        LoadConfig(target=("192.0.2.10", 5060))
    with pytest.raises(TargetNotAllowedError):
        LoadConfig(target=("192.0.2.10", 5060), allow_targets=("198.51.100.0/24",))
    assert LoadConfig(target=("192.0.2.10", 5060), allow_targets=("192.0.2.0/24",)).target[0] == "192.0.2.10"
    check_target("127.0.0.5", ())
    check_target("::1", ())
    with pytest.raises(LoadConfigError):
        check_target("192.0.2.1", ("not-a-cidr",))


def test_targets_must_be_ip_literals_with_a_port() -> None:
    assert parse_target("127.0.0.1:5080") == ("127.0.0.1", 5080)
    assert parse_target("[::1]:5060") == ("::1", 5060)
    for bad in ("localhost:5060", "127.0.0.1", "127.0.0.1:0", "sip.example.com:5060"):
        with pytest.raises(LoadConfigError):
            parse_target(bad)


def test_every_run_has_a_finite_hard_deadline() -> None:
    config = LoadConfig(cps=10, calls=30, duration_s=10, total=60)
    # 6 s placing, two waves of (10 s + setup timeout), plus the margin
    assert config.hard_deadline_s == pytest.approx(6 + 2 * (10 + 10) + 15)
    assert math.isfinite(LoadConfig().hard_deadline_s)


def test_shares_split_the_load_and_the_port_range_without_overlap() -> None:
    config = LoadConfig(cps=30, calls=10, total=31, rtp_ports=(40000, 40999))
    shares = [config.share(i, 3) for i in range(3)]
    assert sum(s.total_calls for s in shares) == 31
    assert sum(s.calls for s in shares) == 10
    assert sum(s.cps for s in shares) == pytest.approx(30)
    ranges = [s.rtp_ports for s in shares]
    for (_, a_hi), (b_lo, _) in itertools.pairwise(ranges):
        assert a_hi < b_lo
    assert len({s.seed for s in shares}) == 3


# ----------------------------------------------------------------------------------------- pacing


def _seq_ts(packet: bytes) -> tuple[int, int, int]:
    _, b1, seq, ts, _ = struct.unpack_from("!BBHII", packet)
    return b1 & 0x7F, seq, ts


def test_frame_index_comes_from_the_absolute_deadline_not_from_counting() -> None:
    schedule = FrameSchedule(1000.0)
    sender = CallSender(
        payloads=[bytes([k]) * 160 for k in range(100)],
        silence=b"\xff" * 160,
        payload_type=0,
        samples_per_frame=160,
        ssrc=1,
        seq0=65530,
        ts0=2**32 - 320,
        start_tick=schedule.tick(1000.0 + 5 * 0.02),
    )
    # ticks 5, 6, then the clock skips 7 and 8 (it fell behind), then 9
    sent = [sender.packet(schedule.tick(1000.0 + k * 0.02 + 0.0004)) for k in (4, 5, 6, 9)]
    assert sent[0] is None  # before the call's first tick
    fields = [_seq_ts(p) for p in sent[1:] if p is not None]
    assert [seq for _, seq, _ in fields] == [65530, 65531, (65530 + 4) & 0xFFFF]
    assert [ts for _, _, ts in fields] == [2**32 - 320, 2**32 - 160, 320]
    assert sent[3] is not None and sent[3][12:] == bytes([4]) * 160  # frame 4 of the plan, not frame 2


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.integers(min_value=0, max_value=10**6))
def test_schedule_ticks_round_trip_and_tolerate_late_firing(t0: float, k: int) -> None:
    schedule = FrameSchedule(t0)
    assert schedule.tick(schedule.deadline(k)) == k
    assert schedule.tick(schedule.deadline(k) + 0.009) == k  # a tick that fired 9 ms late is still tick k
    assert schedule.next_tick(schedule.deadline(k) + 0.001) == k + 1


def test_dtmf_replaces_audio_frames_with_telephone_events_on_the_same_sequence() -> None:
    sender = CallSender(
        payloads=[b"\x00" * 160] * 50,
        silence=b"\xff" * 160,
        payload_type=0,
        samples_per_frame=160,
        ssrc=7,
        seq0=10,
        ts0=0,
        start_tick=0,
        dtmf="5",
        dtmf_at_frame=3,
        telephone_event_pt=101,
    )
    packets = [sender.packet(k) for k in range(15)]
    types = [_seq_ts(p)[0] for p in packets if p is not None]
    assert types[:3] == [0, 0, 0] and types[3] == 101
    assert [_seq_ts(p)[1] for p in packets if p is not None] == list(range(10, 25))
    assert sender.dtmf_sent == 1 and sender.sent == 15


# ----------------------------------------------------------------------------------------- plans


def test_plan_opens_with_silence_and_puts_a_marker_into_every_spurt() -> None:
    pattern = TalkPattern(talk_ms=400, pause_ms=600, barge_in_ms=200)
    plan = plan_call_audio(speech_like(8000, 3.0), 8000, seconds=4.0, pattern=pattern)
    assert plan.pcm.size == 32000
    assert not plan.pcm[:8000].any()  # 1 s lead-in
    # spurt 0: 1000-1400 ms, barge pause 200 ms, spurt 1: 1600-2000 ms, pause 600 ms, spurt 2 at 2600 ms ...
    assert plan.spurts[:3] == ((8000, 11200), (12800, 16000), (20800, 24000))
    assert plan.markers == tuple(start + 1600 for start, _ in plan.spurts)  # 200 ms into each spurt
    assert plan.barged[0] and not plan.barged[1]  # every second pause is a barge-in
    assert not plan.pcm[11200:12800].any()
    assert all(end + 600 * 8 <= 32000 for _, end in plan.spurts)  # the full pause fits after each
    first = plan.markers[0]
    assert np.array_equal(plan.pcm[first : first + 480], chirp(8000, ms=60))
    assert plan.pcm[first - 800 : first].any()  # speech before the marker


@pytest.mark.parametrize("seconds", [3.0, 4.0, 5.18, 5.2, 5.22, 6.0])
def test_a_call_too_short_for_one_spurt_and_its_reply_is_named_before_it_sends_silence(seconds: float) -> None:
    pattern = TalkPattern()  # 1.2 s of talk, 3 s of pause: with the 1 s lead-in a spurt needs 5.2 s
    plan = plan_call_audio(speech_like(8000, 3.0), 8000, seconds=seconds, pattern=pattern)
    reason = silent_call_reason(seconds, pattern, "speech")
    assert (reason is None) == bool(plan.spurts) == (seconds >= 5.2 - 0.01)
    if reason is not None:
        assert not plan.pcm.any()
        assert reason.startswith(f"a call of {seconds:g} s has no room for one talk spurt and its reply")
        assert "= 5.2 s)" in reason and "--duration 6 or more" in reason
    assert silent_call_reason(seconds, pattern, "silence") is None  # silence is what was asked for


# ----------------------------------------------------------------------------------------- analysis


def _receiver_for(
    pcm: np.ndarray,
    *,
    delay_frames: int,
    lose: set[int] = frozenset(),
    late: dict[int, float] = {},  # noqa: B006
    read_late: dict[int, float] | None = None,
    codec: Codec = "PCMU",
):
    """What a receiver would hold for an echo of ``pcm`` (frames sent at k * 20 ms) delayed by N frames.

    ``read_late``: the packets carry kernel arrival stamps, and these were read that much after arriving."""
    payloads = _codec.encode(pcm, codec)
    pt, samples = _codec.PAYLOAD_TYPES[codec], _codec.timestamp_step(codec)
    receiver = CallReceiver(audio_pt=pt, clock_rate=_codec.clock_rate(codec))
    stream = [_codec.silence_payload(codec)] * delay_frames + payloads
    for i, payload in enumerate(stream):
        if i in lose:
            continue
        header = struct.pack("!BBHII", 0x80, pt, (60000 + i) & 0xFFFF, 5000 + samples * i, 9)
        arrival = 10.0 + i * 0.02 + 0.001 + late.get(i, 0.0)
        if read_late is None:
            receiver.datagram(header + payload, arrival)
        else:
            receiver.datagram(header + payload, arrival, arrival + read_late.get(i, 0.0002))
    return receiver


def _frame_sent(k: int) -> float:
    return 10.0 + k * 0.02


def test_analysis_measures_the_marker_round_trip_and_matching_audio() -> None:
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(8000, 2.0), 8000, seconds=3.0, pattern=pattern)
    result = analyze_call(plan, _receiver_for(plan.pcm, delay_frames=3), codec="PCMU", frame_sent=_frame_sent)
    assert result.markers_expected == result.markers_found == 2
    assert result.rtt_ms == pytest.approx((61.0, 61.0), abs=0.01)  # 3 frames + 1 ms transit
    assert result.audio_ok and min(result.correlations) > 0.98
    assert result.pacing_p99_ms == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("start", [28800, 2563200])
def test_an_opus_marker_two_passes_bent_still_counts_as_come_back(start: int) -> None:
    """Two Opus passes (the caller's encoder, then the target's) bend some markers' waveform so far that the
    matched filter scores them under 0.5 (these two: 0.41 and 0.31); their spectrogram still finds them."""
    plan = plan_call_audio(source_audio("speech", 48000), 48000, seconds=8.0, pattern=TalkPattern(), offset=start)
    echo = _codec.decode(_codec.encode(plan.pcm, "opus"), "opus")  # the caller's pass; the receiver's is the target's
    heard = _codec.decode(_codec.encode(echo, "opus"), "opus")
    marker = chirp(48000, ms=MARKER_MS)
    (at,) = plan.markers
    window = heard[at - 4800 : at + 9600]
    assert find_marker(window, marker, min_score=-1.0).score < 0.5
    slips = tuple(k * 480 for k in range(-4, 9) if k)  # what the call analysis allows a jitter buffer
    found = find_marker(window, marker, slips=slips)
    assert found is not None and found.by_spectrogram and found.score > 0.8
    assert found.slip == 0  # not mistaken for a marker with a frame dropped from its middle (the 0.31 one was)
    result = analyze_call(plan, _receiver_for(echo, delay_frames=3, codec="opus"), codec="opus", frame_sent=_frame_sent)
    assert result.markers_expected == result.markers_found == 1 and result.audio_ok
    # Nothing slipped. (Behind the first marker, one bent block of speech matches best 9 ms off and the next is
    # back: before one-block excursions were discounted, that read as two slips.)
    assert result.slips == 0
    # 3 frames + 1 ms transit + libopus's look-ahead (6.5 ms) in each pass, to within the spectrogram's 1 ms hop
    assert result.rtt_ms[0] == pytest.approx(61.0 + 2 * 6.5, abs=1.0)


def test_analysis_fails_audio_that_is_not_what_was_sent() -> None:
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(8000, 2.0), 8000, seconds=3.0, pattern=pattern)
    other = plan_call_audio(speech_like(8000, 2.0, seed=99), 8000, seconds=3.0, pattern=pattern, offset=4321)
    result = analyze_call(plan, _receiver_for(other.pcm, delay_frames=2), codec="PCMU", frame_sent=_frame_sent)
    assert result.markers_found == 2  # markers are the same chirp: the speech after them is what differs
    assert result.audio_ok is False and max(result.correlations) < 0.5


def test_analysis_reports_late_packets_as_pacing_error_and_lost_markers() -> None:
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(8000, 2.0), 8000, seconds=3.0, pattern=pattern)
    late = {i: 0.015 for i in range(0, 150, 10)}  # 15 of 150 packets 15 ms late
    first = plan.markers[0] // 160 + 1  # the echoed first marker's three frames are lost
    receiver = _receiver_for(plan.pcm, delay_frames=1, late=late, lose={first, first + 1, first + 2})
    result = analyze_call(plan, receiver, codec="PCMU", frame_sent=_frame_sent)
    assert result.markers_found == 1 and result.missing == (0,) and result.audio_ok is False
    assert result.pacing_p99_ms == pytest.approx(15.0, abs=0.01)
    assert receiver.stats.cumulative_lost == 3


def test_a_packet_the_generator_read_late_is_its_own_delay_not_the_targets_pacing_error() -> None:
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(8000, 2.0), 8000, seconds=3.0, pattern=pattern)
    read_late = {i: 0.030 for i in range(0, 150, 10)}  # the generator's loop stalled: 15 packets read 30 ms late
    receiver = _receiver_for(plan.pcm, delay_frames=3, read_late=read_late)
    result = analyze_call(plan, receiver, codec="PCMU", frame_sent=_frame_sent)
    assert result.pacing_p99_ms == pytest.approx(0.0, abs=1e-6)  # sent on the grid: the kernel's stamps say so
    assert result.rtt_ms == pytest.approx((61.0, 61.0), abs=0.01)
    assert result.read_delay_hist is not None and int(result.read_delay_hist.sum()) == len(receiver.seqs)
    assert histogram_percentile(result.read_delay_hist, 50) == 0.25  # the rest were read within 0.25 ms
    assert histogram_percentile(result.read_delay_hist, 99) == pytest.approx(30.0, abs=0.3)


def test_analysis_counts_a_frame_dropped_inside_a_marker_as_a_slip_not_a_lost_marker() -> None:
    """Every packet delivered, the reply right, but the echo lost 20 ms from the middle of the second chirp."""
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(8000, 2.0), 8000, seconds=3.0, pattern=pattern)
    cut = plan.markers[1] + 20 * 8  # 20 ms into the 60 ms chirp
    echoed = np.concatenate([plan.pcm[:cut], plan.pcm[cut + 160 :], np.zeros(160, np.int16)])
    result = analyze_call(plan, _receiver_for(echoed, delay_frames=3), codec="PCMU", frame_sent=_frame_sent)
    assert result.missing == ()
    assert result.markers_expected == result.markers_found == 2
    assert result.slips == 1
    assert result.rtt_ms == pytest.approx((61.0, 61.0), abs=0.01)  # the head of the marker came back on time
    assert result.audio_ok and min(result.correlations) > 0.98


def test_a_call_that_heard_nothing_expects_the_replies_a_heard_call_would() -> None:
    """The replies to spurts the caller barges in on are not expected, whether or not any packet came back."""
    pattern = TalkPattern(talk_ms=400, pause_ms=600, barge_in_ms=200)
    plan = plan_call_audio(speech_like(8000, 3.0), 8000, seconds=4.0, pattern=pattern)
    unbarged = sum(1 for barged in plan.barged if not barged)
    assert 0 < unbarged < len(plan.barged)
    silent = analyze_call(plan, CallReceiver(audio_pt=0, clock_rate=8000), codec="PCMU", frame_sent=_frame_sent)
    heard = analyze_call(plan, _receiver_for(plan.pcm, delay_frames=3), codec="PCMU", frame_sent=_frame_sent)
    assert silent.markers_expected == heard.markers_expected == unbarged
    assert silent.markers_found == 0 and silent.audio_ok is False


def test_pacing_histogram_percentiles() -> None:
    errors = np.concatenate([np.zeros(980), np.full(20, 0.012)])
    hist = pacing_histogram(errors)
    assert hist.size == PACING_BINS and hist.sum() == 1000
    assert histogram_percentile(hist, 50) == 0.25
    assert histogram_percentile(hist, 99) == pytest.approx(12.25)


# ----------------------------------------------------------------------------------------- merging


def _run(worker: int, started: float, setups: list[float], lost: int) -> RunResult:
    calls = [
        CallResult(
            index=i,
            worker=worker,
            placed_s=i * 0.1,
            outcome="completed",
            status=200,
            setup_ms=s,
            answered_s=i * 0.1 + s / 1000,
            ended_s=5.0,
            packets_sent=250,
            packets_received=250 - lost,
            expected=250,
            lost=lost,
            jitter_ms=1.0,
            rtt_ms=(40.0 + worker,),
            rtt_at_s=(1.0,),
            markers_expected=1,
            markers_found=1,
            correlation_min=0.99,
            audio_ok=True,
        )
        for i, s in enumerate(setups)
    ]
    hist = np.zeros(PACING_BINS, dtype=np.int64)
    hist[4] = 250 * len(setups)
    timeline = [TimelineSample(t_s=1.0, up=len(setups), placed=len(setups), failed=0, loss_pct=0.0, jitter_p99_ms=1)]
    return RunResult(
        worker=worker, started_wall=started, elapsed_s=6.0, calls=calls, timeline=timeline, pacing_hist=hist
    )


def test_merge_puts_workers_on_one_time_axis_and_sums_everything() -> None:
    merged = merge([_run(0, 100.0, [10.0, 20.0], 0), _run(1, 100.5, [30.0], 5)])
    assert len(merged.calls) == 3
    late = next(c for c in merged.calls if c.worker == 1)
    assert late.placed_s == pytest.approx(0.5) and late.rtt_at_s == (1.5,)
    assert merged.elapsed_s == pytest.approx(6.5)
    summary = aggregate(merged)
    assert summary["calls"] == summary["answered"] == 3
    assert summary["packets_lost"] == 5 and summary["loss_pct"] == pytest.approx(100 * 5 / 750)
    assert summary["setup_ms"]["max"] == 30.0 and summary["rtt_ms"]["count"] == 3
    assert summary["pacing_error_ms"]["packets"] == 750
    assert summary["max_concurrent"] == 3  # the two workers' samples of the same second add up


def _quiet_runs_ms(pcm: np.ndarray, rate: int, dbfs: float = -45.0) -> list[int]:
    """Lengths of the stretches a -45 dBFS, 20 ms turn detector would hear as silence."""
    frame = rate // 50
    rms = np.sqrt(np.mean(pcm[: pcm.size // frame * frame].astype(np.float64).reshape(-1, frame) ** 2, axis=1))
    runs, run = [], 0
    for quiet in (rms < 32767 * 10 ** (dbfs / 20)).tolist():
        run = run + 1 if quiet else 0
        runs.append(run * 20)
    return runs


def test_pauses_are_capped_and_the_speech_around_them_kept_in_order() -> None:
    rate = 8000
    loud = (8000 * np.sin(np.arange(800) * 0.3)).astype(np.int16)  # 100 ms
    quiet = np.zeros
    pcm = np.concatenate([loud, quiet(4800, np.int16), loud[::-1], quiet(1600, np.int16), loud])
    capped = cap_pauses(pcm, rate, max_ms=250)
    assert capped.size == pcm.size - (4800 - 2000)  # 600 ms cut to 250; the 200 ms pause untouched
    expected = np.concatenate([loud, quiet(2000, np.int16), loud[::-1], quiet(1600, np.int16), loud])
    assert np.array_equal(capped, expected)


def test_speech_source_has_no_pause_a_turn_detector_would_end_a_turn_on() -> None:
    for rate in (8000, 48000):
        assert max(_quiet_runs_ms(source_audio("speech", rate), rate)) <= PAUSE_CAP_MS


def test_the_generator_decodes_a_corrupt_opus_payload_as_silence_and_goes_on() -> None:
    """What came back is decoded after the load; a payload libopus refuses is 20 ms of zeros, as a lost one."""
    tone = (np.sin(np.arange(960 * 4) * 2 * np.pi * 440 / 48000) * 8000).astype(np.int16)
    good = _codec.encode(tone, "opus")
    decoded = _codec.decode([good[0], b"\xff\xff\xff", None, good[3]], "opus")
    assert decoded.size == 4 * 960
    assert not decoded[960:2880].any()  # the corrupt payload and the lost one
    assert np.abs(decoded[:960]).max() > 1000 and np.abs(decoded[2880:]).max() > 1000


def test_g722_plans_are_16_khz_audio_on_an_8000_rtp_clock() -> None:
    assert (_codec.audio_rate("G722"), _codec.clock_rate("G722"), _codec.PAYLOAD_TYPES["G722"]) == (16000, 8000, 9)
    assert (_codec.samples_per_frame("G722"), _codec.timestamp_step("G722")) == (320, 160)
    pattern = TalkPattern(talk_ms=400, pause_ms=600)
    plan = plan_call_audio(speech_like(16000, 2.0), 16000, seconds=3.0, pattern=pattern)
    payloads = _codec.encode(plan.pcm, "G722")
    assert {len(p) for p in payloads} == {160} and len(payloads) == plan.pcm.size // 320
    assert len(_codec.silence_payload("G722")) == 160
    receiver = _receiver_for(plan.pcm, delay_frames=3, codec="G722")
    result = analyze_call(plan, receiver, codec="G722", frame_sent=_frame_sent)
    assert result.markers_expected == result.markers_found == 2
    # 3 frames + 1 ms transit, plus the codec's own 22 samples at 16 kHz (what a gateway's round trip adds too)
    assert result.rtt_ms == pytest.approx((62.4, 62.4), abs=0.3)
    assert result.audio_ok and min(result.correlations) > 0.9
    assert result.pacing_p99_ms < 0.01  # on the 8000 clock: packets exactly 20 ms apart read as on time
