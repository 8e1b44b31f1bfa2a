"""Jitter buffer and reception statistics: reorder, late, duplicates, wraparound, SSRC change, loss, A.8 jitter."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.media import jitter, reception
from gateway.media.call import MediaCall, MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.jitter import JitterBuffer, JitterConfig
from gateway.media.reception import ReceptionStats
from gateway.media.rtp import RtpPacket

PEER = ("192.0.2.10", 4000)


def make_call(**overrides: object) -> MediaCall:
    fields: dict[str, object] = {
        "call_id": "c1",
        "codec": "PCMU",
        "payload_type": 0,
        "telephone_event_pt": 101,
        "remote_rtp": PEER,
        "ssrc": 1234,
        "initial_sequence": 100,
        "initial_timestamp": 5000,
    }
    fields.update(overrides)
    return MediaCall(MediaCallConfig(**fields), now=0.0)  # type: ignore[arg-type]


def frame(n: int, size: int = 160) -> bytes:
    return bytes([n % 256]) * size


def send(call: MediaCall, seq: int, ts: int, payload: bytes, now: float, *, ssrc: int = 77, pt: int = 0) -> str | None:
    packet = RtpPacket(False, pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc, payload)
    return call.receive(packet, PEER, now)


def pops(call: MediaCall, count: int) -> list[tuple[int, bytes | None]]:
    out = []
    for _ in range(count):
        payload = call.jitter_buffer.pop()
        out.append((call.jitter_buffer.status, payload))
    return out


def test_prefill_then_in_order_playout() -> None:
    call = make_call()
    assert send(call, 1, 0, frame(1), 0.0) is None
    assert pops(call, 1) == [(jitter.SILENT, None)]  # 20 ms buffered < 40 ms start delay
    send(call, 2, 160, frame(2), 0.02)
    send(call, 3, 320, frame(3), 0.04)
    assert [p for _, p in pops(call, 2)] == [frame(1), frame(2)]
    assert call.jitter_buffer.played == 2 and call.jitter_buffer.concealed == 0


def test_reordered_packets_play_in_order() -> None:
    call = make_call()
    for seq in (1, 3, 2, 4):
        assert send(call, seq, (seq - 1) * 160, frame(seq), 0.0) is None
    assert [p for _, p in pops(call, 4)] == [frame(1), frame(2), frame(3), frame(4)]
    stats = call.stats(0.1)
    assert stats.reordered == 1 and stats.lost == 0 and stats.received == 4


def test_duplicate_is_dropped_and_counted() -> None:
    call = make_call()
    assert send(call, 1, 0, frame(1), 0.0) is None
    assert send(call, 1, 0, frame(1), 0.001) == "duplicate"
    send(call, 2, 160, frame(2), 0.02)
    assert send(call, 1, 0, frame(1), 0.03) == "duplicate"  # reordered duplicate, found in the seen ring
    assert [p for _, p in pops(call, 2)] == [frame(1), frame(2)]
    assert call.stats(0.1).duplicates == 2


def test_late_packet_after_its_slot_is_dropped() -> None:
    call = make_call()
    send(call, 1, 0, frame(1), 0.0)
    send(call, 2, 160, frame(2), 0.02)
    send(call, 4, 480, frame(4), 0.06)
    assert pops(call, 3) == [(jitter.PLAYED, frame(1)), (jitter.PLAYED, frame(2)), (jitter.CONCEALED, None)]
    assert send(call, 3, 320, frame(3), 0.08) == "late"
    assert pops(call, 1) == [(jitter.PLAYED, frame(4))]
    stats = call.stats(0.1)
    assert stats.late == 1 and stats.concealed == 1 and stats.reordered == 1


def test_loss_is_concealed_and_counted_with_fec_peek() -> None:
    call = make_call()
    for seq in (1, 2, 4, 5):
        send(call, seq, (seq - 1) * 160, frame(seq), 0.0)
    out = []
    for _ in range(4):
        payload = call.jitter_buffer.pop()
        out.append((call.jitter_buffer.status, payload, call.jitter_buffer.fec_payload))
    assert out[2] == (jitter.CONCEALED, None, frame(4))  # the next frame is offered for FEC recovery
    assert [p for _, p, _ in out] == [frame(1), frame(2), None, frame(4)]
    stats = call.stats(0.1)
    assert stats.lost == 1 and stats.concealed == 1 and stats.received == 4


@pytest.mark.parametrize("start_seq", [65530, 65535])
def test_sequence_and_timestamp_wraparound(start_seq: int) -> None:
    call = make_call()
    ts0 = 2**32 - 3 * 160
    for i in range(10):
        assert send(call, start_seq + i, ts0 + i * 160, frame(i), i * 0.02) is None
    assert [p for _, p in pops(call, 10)] == [frame(i) for i in range(10)]
    stats = call.stats(0.3)
    assert stats.lost == 0 and stats.late == 0 and stats.reordered == 0
    _, _, highest, _ = call.reception.report_block()
    assert highest == start_seq + 9  # the extended highest sequence number counts the cycle


def test_reordering_across_the_wrap() -> None:
    call = make_call()
    ts0 = 2**32 - 160
    order = [(65535, 0), (1, 2), (0, 1), (2, 3)]
    for seq, i in order:
        assert send(call, seq, ts0 + i * 160, frame(i), 0.0) is None
    assert [p for _, p in pops(call, 4)] == [frame(i) for i in range(4)]
    assert call.stats(0.1).lost == 0


def test_ssrc_change_resyncs_playout() -> None:
    call = make_call()
    for i in range(5):
        send(call, 10 + i, 1000 + i * 160, frame(i), i * 0.02)
    assert [p for _, p in pops(call, 3)] == [frame(0), frame(1), frame(2)]
    # A new source with unrelated sequence and timestamp bases (e.g. after a transfer).
    for i in range(3):
        assert send(call, 40000 + i, 9_000_000 + i * 160, frame(100 + i), 0.1 + i * 0.02, ssrc=99) is None
    played = [p for s, p in pops(call, 4) if s == jitter.PLAYED]
    assert played == [frame(100), frame(101), frame(102)]
    stats = call.stats(0.2)
    assert stats.resyncs >= 1 and stats.lost == 0 and stats.received == 8


def test_sequence_restart_needs_two_sequential_packets() -> None:
    rx = ReceptionStats(8000)
    assert rx.update(100, 0, 1, 0.0) == reception.SOURCE_CHANGED
    assert rx.update(101, 160, 1, 0.02) == reception.ACCEPTED
    assert rx.update(30000, 500, 1, 0.04) == reception.OUT_OF_RANGE
    assert rx.update(30001, 660, 1, 0.06) == reception.RESTARTED
    assert rx.update(30002, 820, 1, 0.08) == reception.ACCEPTED
    assert rx.cumulative_lost == 0


def test_rfc3550_a8_jitter_against_hand_computed_value() -> None:
    # 8 kHz, packets every 160 units. Arrival offsets (ms) from the ideal schedule: 0, 5, 0, 10, 10.
    # Transit differences D in timestamp units: 40, -40, 80, 0.
    # J: 0 -> 40/16 = 2.5 -> 2.5 + (40 - 2.5)/16 = 4.84375 -> 4.84375 + (80 - 4.84375)/16 = 9.541015625
    #    -> 9.541015625 + (0 - 9.541015625)/16 = 8.944702148...
    rx = ReceptionStats(8000)
    offsets = [0.0, 0.005, 0.0, 0.010, 0.010]
    for i, off in enumerate(offsets):
        rx.update(i, 1234 + i * 160, 7, 1000.0 + i * 0.020 + off)
    assert rx.jitter == pytest.approx(9.541015625 * 15 / 16, abs=1e-6)
    assert rx.jitter_ms == pytest.approx(rx.jitter / 8.0)
    call = make_call()
    for i, off in enumerate(offsets):
        send(call, i, 1234 + i * 160, frame(i), 1000.0 + i * 0.020 + off)
    assert call.stats(1000.2).jitter_ts == pytest.approx(8.9447021484375)


def test_telephone_events_do_not_count_as_jitter_or_loss() -> None:
    call = make_call()
    send(call, 1, 0, frame(1), 0.0)
    for k in range(4):  # one DTMF press, same timestamp, sent over 80 ms
        send(call, 2 + k, 160, bytes([5, 10]) + (160 * (k + 1)).to_bytes(2, "big"), 0.02 + 0.02 * k, pt=101)
    send(call, 6, 800, frame(6), 0.1)
    stats = call.stats(0.2)
    assert stats.lost == 0 and stats.jitter_ts == 0.0 and stats.dtmf_received == 1


def test_reframes_10_and_30_ms_packets() -> None:
    call = make_call()
    samples = bytes(range(240)) * 2  # 60 ms of distinct codes
    # 10 ms packets for the first 20 ms, then a 30 ms one, then 10 ms.
    send(call, 1, 0, samples[0:80], 0.0)
    send(call, 2, 80, samples[80:160], 0.01)
    send(call, 3, 160, samples[160:400], 0.04)
    send(call, 4, 400, samples[400:480], 0.05)
    assert [p for _, p in pops(call, 3)] == [samples[0:160], samples[160:320], samples[320:480]]
    assert call.stats(0.1).lost == 0


def test_trailing_partial_unit_is_dropped() -> None:
    call = make_call()
    send(call, 1, 0, frame(1, 170), 0.0)
    send(call, 2, 160, frame(2, 170), 0.02)
    assert [p for _, p in pops(call, 2)] == [frame(1), frame(2)]


def test_40_ms_packets_make_two_frames() -> None:
    call = make_call()
    send(call, 1, 0, frame(1, 320), 0.0)
    send(call, 2, 320, frame(2, 320), 0.04)
    assert [p for _, p in pops(call, 4)] == [frame(1), frame(1), frame(2), frame(2)]


def test_half_frame_missing_repeats_the_present_half() -> None:
    call = make_call()
    send(call, 1, 0, frame(1, 80), 0.0)
    send(call, 3, 160, frame(3, 160), 0.0)
    assert pops(call, 1) == [(jitter.PLAYED, frame(1, 160))]


def test_underrun_rebuffers_and_gap_ends_in_silence() -> None:
    call = make_call()
    send(call, 1, 0, frame(1), 0.0)
    send(call, 2, 160, frame(2), 0.02)
    assert [s for s, _ in pops(call, 2)] == [jitter.PLAYED, jitter.PLAYED]
    statuses = [s for s, _ in pops(call, 15)]
    assert statuses[:10] == [jitter.CONCEALED] * 10 and statuses[10:] == [jitter.SILENT] * 5
    # The sender resumes after a pause (silence suppression): the timestamp jumped ahead, playout re-anchors.
    send(call, 3, 160 + 8000 * 3, frame(3), 3.0)
    send(call, 4, 320 + 8000 * 3, frame(4), 3.02)
    assert [p for _, p in pops(call, 2)] == [frame(3), frame(4)]
    assert call.jitter_buffer.underruns == 1 and call.stats(3.1).late == 0


def test_target_delay_adapts_to_jitter_and_is_clamped() -> None:
    cfg = JitterConfig()
    jb = JitterBuffer(clock_rate=8000, unit_samples=80, units_per_frame=2, unit_bytes=80, config=cfg)
    jb.adapt(0.0, 10, 8000)
    assert jb.target_ms == 40  # warm-up: start delay
    jb.adapt(0.0, 100, 8000)
    assert jb.target_ms == 20
    jb.adapt(80.0, 100, 8000)  # 10 ms jitter -> 20 + 3*10 = 50 ms
    assert jb.target_ms == 50
    jb.adapt(8000.0, 100, 8000)  # 1 s jitter -> clamped
    assert jb.target_ms == 200


def test_excess_delay_shrinks_by_one_frame_per_window() -> None:
    call = make_call(jitter=shrinking(hold=0))
    # A burst fills 200 ms, then packets arrive steadily: the buffer holds far more than the 20 ms target.
    ts = 0
    for seq in range(10):
        send(call, seq, ts, tagged(seq, loud=False), 0.0)
        ts += 160
    call.jitter_buffer.adapt(0.0, 100, 8000)
    played = []
    for k in range(40):
        send(call, 10 + k, ts, tagged(10 + k, loud=False), 0.02 * k)
        ts += 160
        payload = call.jitter_buffer.pop()
        if payload is not None:
            played.append(frame_number(payload))
    assert call.jitter_buffer.discarded >= 3
    assert played == sorted(played)  # still in order, frames only skipped


def tagged(k: int, *, loud: bool) -> bytes:
    """Frame ``k`` of a PCMU stream, speech or pause; its number is in its first two (quiet) codes."""
    return bytes([0x5C + k // 36, 0x5C + k % 36]) + (b"\x10" if loud else b"\xff") * 158


def frame_number(payload: bytes) -> int:
    return (payload[0] - 0x5C) * 36 + payload[1] - 0x5C


def play_timeline(
    call: MediaCall,
    late_by: dict[int, int],
    count: int,
    *,
    speech: range = range(0),
    lost: frozenset[int] = frozenset(),
) -> tuple[list[int], list[int]]:
    """Packet k (20 ms; speech when in ``speech``, else a pause) is sent at tick k and arrives ``late_by[k]``
    ticks later, unless it is ``lost``; one pop per tick. Returns the statuses of the pops and the numbers of
    the frames played."""
    arrivals: dict[int, list[int]] = {}
    for k in range(count):
        if k not in lost:
            arrivals.setdefault(k + late_by.get(k, 0), []).append(k)
    statuses, played = [], []
    for tick in range(count):
        for k in arrivals.get(tick, []):
            send(call, k, k * 160, tagged(k, loud=k in speech), tick * 0.02)
        call.jitter_buffer.adapt(0.0, 100, 8000)  # no jitter estimate: the target stays at 20 ms
        payload = call.jitter_buffer.pop()
        statuses.append(call.jitter_buffer.status)
        if payload is not None:
            played.append(frame_number(payload))
    return statuses, played


def burst(first: int, frames: int) -> dict[int, int]:
    """Packets ``first`` .. ``first + frames - 1`` held up and delivered together with the last of them."""
    return {first + i: frames - 1 - i for i in range(frames)}


def shrinking(*, hold: int, wait: int = 250, pause: int = 0) -> JitterConfig:
    return JitterConfig(
        warmup_packets=0,
        shrink_window_frames=10,
        shrink_hold_frames=hold,
        shrink_wait_frames=wait,
        shrink_pause_frames=pause,
    )


def played_at(statuses: list[int], played: list[int]) -> dict[int, int]:
    """Frame number -> the tick that played it."""
    ticks = [tick for tick, status in enumerate(statuses) if status == jitter.PLAYED]
    return dict(zip(played, ticks, strict=True))


def forty_ms() -> JitterConfig:
    return JitterConfig(warmup_packets=0, min_delay_ms=40, start_delay_ms=40)


def test_a_loss_met_at_the_shallowest_point_is_concealed_in_place_not_rebuffered() -> None:
    # 40 ms of delay, and from frame 30 on each packet arrives just after the pop it would have met in time
    # (a tick later): the buffer is a frame deep when frame 29 is found missing, and nothing newer is there.
    call = make_call(jitter=forty_ms())
    statuses, played = play_timeline(call, {k: 1 for k in range(30, 80)}, 80, lost=frozenset({29}))
    at = played_at(statuses, played)
    jb = call.jitter_buffer
    assert played == [k for k in range(79) if k != 29]
    # Frame 30 comes on time for its turn: the gap was a loss, concealed in its place; nothing moved.
    assert all(at[k] == k + 1 for k in played) and statuses[30] == jitter.CONCEALED
    assert jb.concealed == 1 and jb.underruns == 0


def test_a_packet_behind_the_gap_is_an_underrun_and_the_delay_grows() -> None:
    # Frames 29-31 are held and delivered together two ticks late: frame 29's turn passed while nothing was
    # there, so this is an underrun: playout re-anchors on frame 29 and the delay grows by the wait.
    call = make_call(jitter=forty_ms())
    statuses, played = play_timeline(call, {29: 2, 30: 1}, 80)
    at = played_at(statuses, played)
    jb = call.jitter_buffer
    assert jb.underruns == 1 and played == list(range(len(played)))  # nothing lost
    assert at[28] == 29 and at[29] > 30 and at[60] - 60 > at[28] - 28


def forty_ms_after_ten_frames() -> tuple[MediaCall, JitterBuffer]:
    """A 40 ms buffer that frames 0-9 reached one a tick, and that played 0-8."""
    call = make_call(jitter=forty_ms())
    play_timeline(call, {}, 10)
    return call, call.jitter_buffer


def test_a_stall_while_the_gap_was_undecided_counts_its_frames_as_passed() -> None:
    call, jb = forty_ms_after_ten_frames()
    assert jb.pop() is not None and jb.pop() is None  # frame 9, then 10 is missing with nothing newer
    jb.skip(2)  # the tick skipped the turns of frames 11 and 12
    # Frame 11 would have been on time without the stall; after it, its turn has gone by.
    send(call, 11, 11 * 160, tagged(11, loud=True), 0.25)
    assert jb.underruns == 1 and not jb.playing


def test_a_gap_longer_than_concealment_is_an_underrun_once_it_outlasts_it() -> None:
    call, jb = forty_ms_after_ten_frames()
    assert jb.pop() is not None
    for _ in range(jb.config.max_conceal_frames):
        assert jb.pop() is None and jb.status == jitter.CONCEALED
    assert jb.underruns == 0  # the next packet may yet come on time
    assert jb.pop() is None and jb.status == jitter.SILENT and jb.underruns == 1
    # The sender resumes after the pause: playout re-anchors (prefills), and the underrun is not counted twice.
    send(call, 30, 30 * 160, tagged(30, loud=True), 0.6)
    assert jb.underruns == 1 and not jb.playing


def test_a_new_stream_while_a_gap_was_undecided_is_an_underrun() -> None:
    call, jb = forty_ms_after_ten_frames()
    assert jb.pop() is not None and jb.pop() is None and jb.underruns == 0
    send(call, 500, 90_000, tagged(0, loud=True), 0.25, ssrc=78)  # another source: its stream starts afresh
    assert jb.underruns == 1 and not jb.playing


def test_delay_grown_by_an_underrun_is_held_against_the_next_burst() -> None:
    call = make_call(jitter=shrinking(hold=100))
    # Two 80 ms bursts 40 frames apart: the first is an underrun that grows the delay to what it needed;
    # the grown delay is kept, so the second plays through without a gap and nothing is dropped.
    statuses, played = play_timeline(call, {**burst(20, 4), **burst(60, 4)}, 100)
    jb = call.jitter_buffer
    assert jb.underruns == 1 and jb.discarded == 0
    assert jitter.CONCEALED not in statuses[60:]
    assert played == list(range(len(played)))


def test_without_the_hold_every_burst_is_an_underrun_and_a_dropped_frame() -> None:
    call = make_call(jitter=shrinking(hold=0))
    play_timeline(call, {**burst(20, 4), **burst(60, 4)}, 100)
    jb = call.jitter_buffer
    assert jb.underruns == 2 and jb.discarded >= 4


def test_held_delay_shrinks_once_the_hold_has_passed() -> None:
    call = make_call(jitter=shrinking(hold=30))
    statuses, played = play_timeline(call, burst(20, 4), 120)
    jb = call.jitter_buffer
    assert jb.underruns == 1 and jb.discarded == 3  # back to the 20 ms target, one frame per window
    assert jb.buffered_ms <= 20 and statuses[-1] == jitter.PLAYED
    dropped = sorted(set(range(played[-1])) - set(played))
    assert len(dropped) == 3 and dropped[0] > 23 + 30  # nothing given back within the hold


def test_a_due_shrink_drops_a_frame_of_the_next_pause_not_of_speech() -> None:
    call = make_call(jitter=shrinking(hold=0, pause=5))
    # The burst leaves 60 ms of excess in the middle of speech (frames 0-59); the pause is frames 60-99.
    _, played = play_timeline(call, burst(20, 4), 140, speech=range(60))
    dropped = sorted(set(range(played[-1])) - set(played))
    assert call.jitter_buffer.discarded == len(dropped) == 3
    assert all(60 + 5 <= k < 100 for k in dropped)  # five quiet frames into the pause, then one per window


def test_a_due_shrink_in_endless_speech_drops_a_frame_when_the_wait_is_over() -> None:
    call = make_call(jitter=shrinking(hold=0, wait=40, pause=5))
    _, played = play_timeline(call, burst(20, 4), 140, speech=range(140))
    dropped = sorted(set(range(played[-1])) - set(played))
    assert call.jitter_buffer.discarded == len(dropped) >= 1
    assert dropped[0] == 20 + 10 + 40  # frame 20 plays first after the burst: its window, then the whole wait


def stalled_timeline(call: MediaCall, *, stall: range, skipped: int, count: int, speech: set[int]) -> list[int]:
    """One packet a tick, on time; no pop during ``stall`` (the worker stalled), then ``skipped`` ticks are
    reported skipped and the pops go on. Returns the numbers of the frames played."""
    played = []
    for tick in range(count):
        send(call, tick, tick * 160, tagged(tick, loud=tick in speech), tick * 0.02)
        if tick in stall:
            continue
        if tick == stall.stop and skipped:
            call.skip_ticks(skipped)
        call.jitter_buffer.adapt(0.0, 100, 8000)
        payload = call.jitter_buffer.pop()
        if payload is not None:
            played.append(frame_number(payload))
    return played


SPEECH_THEN_PAUSE = set(range(60)) | set(range(120, 200))  # a pause of 1.2 s: frames 60-119


def test_frames_a_stall_left_behind_are_dropped_in_the_next_pause_not_from_speech() -> None:
    call = make_call(jitter=JitterConfig(warmup_packets=0))
    played = stalled_timeline(call, stall=range(30, 38), skipped=8, count=200, speech=SPEECH_THEN_PAUSE)
    dropped = sorted(set(range(played[-1])) - set(played))
    assert len(dropped) == 8 == call.jitter_buffer.discarded
    assert all(60 + 5 <= k < 120 for k in dropped)  # five quiet frames into the pause, none of the words
    assert call.jitter_buffer.buffered_ms <= 40  # the delay the stall added is gone by the end of the pause


def test_without_the_skip_the_stalls_frames_stay_as_delay() -> None:
    call = make_call(jitter=JitterConfig(warmup_packets=0))
    stalled_timeline(call, stall=range(30, 38), skipped=0, count=200, speech=SPEECH_THEN_PAUSE)
    assert call.jitter_buffer.discarded <= 3  # one frame per second at most, through the shrink
    assert call.jitter_buffer.buffered_ms >= 120


def test_a_stall_in_endless_speech_keeps_every_word() -> None:
    call = make_call(jitter=JitterConfig(warmup_packets=0, shrink_wait_frames=10_000))
    played = stalled_timeline(call, stall=range(30, 38), skipped=8, count=200, speech=set(range(200)))
    assert played == list(range(len(played)))  # nothing dropped while the caller talks


def opus_run(*, quiet_from: int, wait: int = 250) -> tuple[JitterBuffer, list[int]]:
    """An Opus buffer 160 ms too deep; the tick reports each played frame quiet from frame ``quiet_from`` on."""
    config = shrinking(hold=0, wait=wait, pause=5)
    jb = JitterBuffer(clock_rate=48000, unit_samples=960, units_per_frame=1, unit_bytes=0, config=config)
    for k in range(8):  # 160 ms arrive at once; then one a tick
        jb.push(k * 960, bytes([k]) * 40)
    played = []
    for k in range(8, 80):
        jb.push(k * 960, bytes([k]) * 40)
        jb.adapt(0.0, 100, 48000)
        payload = jb.pop()
        assert payload is not None
        played.append(payload[0])
        if jb.wants_level:  # what the tick does after decoding the frame
            jb.heard(payload[0] >= quiet_from)
    return jb, played


def test_opus_frames_are_judged_by_what_the_tick_heard_and_dropped_in_a_pause() -> None:
    jb, played = opus_run(quiet_from=40)
    dropped = sorted(set(range(played[-1])) - set(played))
    assert jb.discarded == len(dropped) >= 1
    assert dropped[0] >= 40 + 5  # five quiet frames heard first, though the shrink was due long before


def test_opus_with_no_pause_drops_when_the_wait_is_over() -> None:
    jb, played = opus_run(quiet_from=1000, wait=20)
    dropped = sorted(set(range(played[-1])) - set(played))
    assert jb.discarded == len(dropped) >= 1 and dropped[0] >= 10 + 20


def test_config_validation() -> None:
    with pytest.raises(LocalMediaError):
        JitterConfig(min_delay_ms=10)
    with pytest.raises(LocalMediaError):
        JitterConfig(start_delay_ms=300)


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(12))), st.sets(st.integers(0, 11), max_size=4))
def test_any_arrival_order_plays_frames_in_order_without_repeats(order: list[int], lost: set[int]) -> None:
    call = make_call(jitter=JitterConfig(start_delay_ms=200, max_delay_ms=200, min_delay_ms=200))
    base_seq, base_ts = 65530, 2**32 - 800
    for i in [*order, *range(12, 22)]:  # a shuffled head, then an in-order tail long enough to prefill
        if i not in lost:
            send(call, base_seq + i, base_ts + i * 160, frame(i), 0.0)
    played = [p[0] for s, p in pops(call, 22) if s == jitter.PLAYED and p is not None]
    first = min(set(range(22)) - lost)
    assert played == [i for i in range(first, 22) if i not in lost]
    assert call.stats(0.0).lost == len({i for i in lost if i > first})


def test_an_opus_stalls_frames_are_dropped_one_a_tick_once_the_tick_hears_a_pause() -> None:
    jb = JitterBuffer(
        clock_rate=48000, unit_samples=960, units_per_frame=1, unit_bytes=0, config=JitterConfig(warmup_packets=0)
    )
    played = []
    for k in range(100):
        jb.push(k * 960, bytes([k]) * 40)
        if 20 <= k < 24:
            continue  # the stall: four pops skipped
        if k == 24:
            jb.skip(4)
        jb.adapt(0.0, 100, 48000)
        payload = jb.pop()
        if payload is not None:
            played.append(payload[0])
            if jb.wants_level:
                jb.heard(payload[0] >= 50)  # what the tick decoded: speech until frame 50
    dropped = sorted(set(range(played[-1])) - set(played))
    assert len(dropped) >= 3 and all(k >= 50 + 5 for k in dropped)  # five quiet frames heard first
    assert all(b - a >= 2 for a, b in itertools.pairwise(dropped))  # one a tick: heard one behind
    assert jb.buffered_ms <= 40 and not jb.wants_level  # back at the target; nothing owed any more


class OpusTimeline:
    """An Opus buffer (``fec`` as the tick builds it for an Opus call) fed one packet a tick: packet k arrives
    ``late_by[k]`` ticks after tick k unless ``lost``; the tick reports what it heard, as it does after decoding
    (speech in ``speech``, a pause elsewhere; a concealed frame sounds like the frame before it)."""

    def __init__(self, *, fec: bool = True, config: JitterConfig | None = None) -> None:
        self.jb = JitterBuffer(
            clock_rate=48000,
            unit_samples=960,
            units_per_frame=1,
            unit_bytes=0,
            config=config or forty_ms(),
            fec=fec,
        )
        self.statuses: list[int] = []
        self.played: dict[int, int] = {}  # frame -> the tick that played it
        self.fec_at: dict[int, bytes | None] = {}  # tick of a concealed frame -> the FEC payload handed out

    def run(self, count: int, *, late_by: dict[int, int], lost: set[int], speech: set[int]) -> OpusTimeline:
        arrivals: dict[int, list[int]] = {}
        for k in range(count):
            if k not in lost:
                arrivals.setdefault(k + late_by.get(k, 0), []).append(k)
        jb, quiet = self.jb, False
        for tick in range(count):
            for k in arrivals.get(tick, []):
                jb.push(k * 960, k.to_bytes(2, "big") * 20)
            jb.adapt(0.0, 100, 48000)
            payload = jb.pop()
            self.statuses.append(jb.status)
            if payload is not None:
                k = int.from_bytes(payload[:2], "big")
                self.played[k] = tick
                quiet = k not in speech
            elif jb.status == jitter.CONCEALED:
                self.fec_at[tick] = jb.fec_payload
            if jb.wants_level:
                jb.heard(quiet)
        return self


# Speech, a pause of 0.8 s (frames 60-99), speech again; from frame 30 on every packet comes just in time for
# its turn, so the buffer is at its shallowest (nothing newer buffered) whenever a frame goes missing.
OPUS_SPEECH = set(range(60)) | set(range(100, 160))
JUST_IN_TIME = {k: 1 for k in range(30, 160)}


def test_an_opus_loss_met_at_the_shallowest_point_grows_the_delay_in_the_next_pause() -> None:
    run = OpusTimeline().run(160, late_by=JUST_IN_TIME, lost={40, 130}, speech=OPUS_SPEECH)
    jb, played = run.jb, run.played
    assert sorted(played) == [k for k in range(158) if k not in (40, 130)]  # nothing dropped or repeated
    assert jb.underruns == 0 and jb.inserted == 1 and jb.discarded == 0
    # Frame 40 was concealed in place without FEC (frame 41 had not come); nothing moved in the speech after it.
    assert run.fec_at[41] is None and all(played[k] == k + 1 for k in range(41, 60))
    # The frame of delay went in five quiet frames into the pause, not into the speech.
    inserted = next(t for t, s in enumerate(run.statuses) if s == jitter.CONCEALED and t > 42)
    assert 60 + 5 < inserted < 100 and all(played[k] == k + 2 for k in range(100, 158) if k != 130)
    # The next loss finds the packet after it buffered: Opus recovers it from its FEC.
    assert run.fec_at[132] == (131).to_bytes(2, "big") * 20


def test_without_fec_a_loss_at_the_shallowest_point_leaves_the_delay_alone() -> None:
    run = OpusTimeline(fec=False).run(160, late_by=JUST_IN_TIME, lost={40, 130}, speech=OPUS_SPEECH)
    assert run.jb.inserted == 0 and run.fec_at[131] is None  # G.711 calls: nothing to recover a frame from
    assert all(run.played[k] == k + 1 for k in range(100, 159) if k != 130)


def test_a_longer_gap_or_endless_speech_inserts_nothing() -> None:
    # Three frames missing (a burst lost, or telephone events in place of audio): FEC would mend one at most.
    burst_run = OpusTimeline().run(160, late_by=JUST_IN_TIME, lost={40, 41, 42}, speech=OPUS_SPEECH)
    assert burst_run.jb.inserted == 0 and burst_run.jb.underruns == 0
    # One frame lost in speech that never pauses: the frame is owed but never put into a word.
    talk = OpusTimeline().run(160, late_by=JUST_IN_TIME, lost={40}, speech=set(range(160)))
    assert talk.jb.inserted == 0 and all(talk.played[k] == k + 1 for k in range(41, 159))
    assert talk.jb.wants_level  # still waiting for a pause


def test_an_opus_call_grows_its_delay_for_fec_and_a_g711_call_does_not() -> None:
    for codec, pt, clock, grows in (("opus", 111, 960, True), ("PCMU", 0, 160, False)):
        call = make_call(codec=codec, payload_type=pt, jitter=forty_ms())
        for tick in range(120):
            for k in (tick,) if tick < 30 else (tick - 1,):  # from frame 30 on, each arrives just in time
                if k != 40:
                    # A 20 ms SILK packet (TOC 0x48) for Opus; a frame of PCMU, speech until frame 60.
                    payload = b"\x48" + bytes(39) if codec == "opus" else tagged(k, loud=k < 60)
                    send(call, k, k * clock, payload, tick * 0.02, pt=pt)
            jb = call.jitter_buffer
            jb.adapt(0.0, 100, clock * 50)
            jb.pop()
            if jb.wants_level:
                jb.heard(tick > 61)  # what the tick decoded: the pause from frame 60 on
        assert call.stats(2.4).inserted == int(grows) and call.stats(2.4).underruns == 0
