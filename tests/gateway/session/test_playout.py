"""Playout of a provider's G.711 codes: framed per item like PCM, kept as codes, counted in 24 kHz samples; and
what queued audio costs the collector."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.session.playout import G711Codes, PlayoutBuffer
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE

SILENCE = {"pcmu": ULAW_SILENCE, "pcma": ALAW_SILENCE}


def codes(count: int, *, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()


def pcm_for(count: int) -> bytes:
    """PCM16 of the same duration as ``count`` codes (three 24 kHz samples per 8 kHz code)."""
    return (np.arange(3 * count, dtype=np.int64) % 2000 + 1).astype("<i2").tobytes()


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_part_frames_carry_across_deltas_and_the_last_is_completed_with_silence_codes(law: str) -> None:
    audio = codes(500)
    buffer = PlayoutBuffer()
    for start, stop in ((0, 7), (7, 170), (170, 333), (333, 500)):
        assert buffer.add(response_id="r", item_id="i", content_index=0, pcm=audio[start:stop], law=law)  # type: ignore[arg-type]
    assert buffer.queued_frames == 3 and buffer.playing
    buffer.finish_item(response_id="r", item_id="i")
    frames = []
    while (popped := buffer.pop()) is not None:
        frames.append(popped[0])
    assert all(isinstance(f, G711Codes) and f.law == law and len(f.codes) == 160 for f in frames)
    played = b"".join(f.codes for f in frames if isinstance(f, G711Codes))
    assert played == audio + bytes([SILENCE[law]]) * 140, "the provider's codes in order, then silence codes"


def test_a_new_item_completes_the_previous_items_part_frame_first() -> None:
    buffer = PlayoutBuffer()
    first, second = codes(250, seed=1), codes(200, seed=2)
    buffer.add(response_id="r", item_id="a", content_index=0, pcm=first, law="pcma")
    buffer.add(response_id="r", item_id="b", content_index=0, pcm=second, law="pcma")
    buffer.finish_response("r")
    popped = []
    while (p := buffer.pop()) is not None:
        popped.append(p)
    assert [item.item_id for _, item in popped] == ["a", "a", "b", "b"]
    got = [audio.codes for audio, _ in popped if isinstance(audio, G711Codes)]
    assert got[1] == first[160:] + bytes([ALAW_SILENCE]) * 70, "a's tail is a's alone, padded"
    assert got[2] == second[:160] and got[3] == second[160:] + bytes([ALAW_SILENCE]) * 120
    assert not buffer.playing


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=10),
    items=st.lists(st.integers(min_value=0, max_value=2), min_size=10, max_size=10),
    pulls=st.integers(min_value=0, max_value=40),
    finish=st.booleans(),
)
def test_code_accounting_equals_pcm_accounting_of_the_same_durations(
    sizes: list[int], items: list[int], pulls: int, finish: bool
) -> None:
    """Deltas of n codes and deltas of 3n PCM samples: the same frames per item, the same sent and received
    samples after every pull, the same truncate positions (ms) on barge-in."""
    by_codes, by_pcm = PlayoutBuffer(), PlayoutBuffer()
    for k, size in enumerate(sizes):
        item = f"i{items[k]}"
        by_codes.add(response_id="r", item_id=item, content_index=0, pcm=codes(size, seed=k), law="pcmu")
        by_pcm.add(response_id="r", item_id=item, content_index=0, pcm=pcm_for(size))
    if finish:
        by_codes.finish_response("r")
        by_pcm.finish_response("r")
    for _ in range(pulls):
        a, b = by_codes.pop(), by_pcm.pop()
        assert (a is None) == (b is None)
        if a is None or b is None:
            break
        assert a[1].item_id == b[1].item_id
        assert (a[1].sent_samples, a[1].received_samples) == (b[1].sent_samples, b[1].received_samples)
        assert (a[1].sent_ms, a[1].received_ms) == (b[1].sent_ms, b[1].received_ms)
    assert by_codes.interrupt() == by_pcm.interrupt()


def test_whole_frames_of_codes_count_as_20_ms() -> None:
    buffer = PlayoutBuffer()
    buffer.add(response_id="r", item_id="i", content_index=0, pcm=codes(160 * 5 + 80), law="pcmu")
    for _ in range(3):
        buffer.pop()
    item = buffer.item("i", response_id="r")
    assert item is not None
    assert (item.sent_samples, item.sent_ms, item.received_samples, item.received_ms) == (1440, 60, 2640, 110)
    (interrupted,) = buffer.interrupt()
    assert (interrupted.sent_ms, interrupted.received_ms, interrupted.audio_end_ms) == (60, 110, 60)


def test_pcm_and_code_items_share_one_queue_in_order() -> None:
    """A profile change from pcm24k to pcmu while the old item still plays."""
    buffer = PlayoutBuffer()
    buffer.add(response_id="r1", item_id="old", content_index=0, pcm=pcm_for(200))
    buffer.add(response_id="r2", item_id="new", content_index=0, pcm=codes(320), law="pcmu")
    kinds = []
    while (p := buffer.pop()) is not None:
        kinds.append((p[1].item_id, "codes" if isinstance(p[0], G711Codes) else "pcm"))
    assert kinds == [("old", "pcm"), ("old", "pcm"), ("new", "codes"), ("new", "codes")]


@pytest.mark.parametrize("law", [None, "pcmu"])
def test_queued_audio_is_one_tracked_object_per_delta_not_per_frame(law: str | None) -> None:
    """Ten seconds of agent speech queued as 100 ms deltas: at most one object the collector tracks per delta,
    so its passes do not walk an object per 20 ms of queued speech (500 here)."""
    delta = codes(800) if law else pcm_for(800)
    buffer = PlayoutBuffer()
    buffer.add(response_id="r", item_id="i", content_index=0, pcm=delta, law=law)  # type: ignore[arg-type]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for _ in range(99):
            buffer.add(response_id="r", item_id="i", content_index=0, pcm=delta, law=law)  # type: ignore[arg-type]
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert buffer.queued_frames == 500
    assert grown <= 99 + 5, f"{grown} tracked objects for 99 deltas of 5 frames"
    played = b"".join(p[0].codes if isinstance(p[0], G711Codes) else p[0].tobytes() for p in iter(buffer.pop, None))
    assert played == delta * 100, "the frames taken are the deltas' audio in order"
