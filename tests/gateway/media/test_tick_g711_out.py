"""The tick's outbound G.711 path with passthrough: code frames go out as they are (same law) or through the
G.711 tables (other law), only PCM frames are resampled, and a row that skipped the resampler starts afresh."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.media.call import MediaCallConfig
from gateway.media.rtp import parse_rtp
from gateway.media.tick import G711Frame, OutboundFrame, TickEngine
from telcodecs.frames import FRAME_SAMPLES, Frame, FrameError
from telcodecs.g711 import (
    ALAW_SILENCE,
    ULAW_SILENCE,
    alaw_decode,
    alaw_encode,
    ulaw_decode,
    ulaw_encode,
)
from telcodecs.resample import StreamResampler

PEER = ("192.0.2.10", 4000)
ENCODE = {"PCMU": ulaw_encode, "PCMA": alaw_encode}
SILENCE = {"PCMU": bytes([ULAW_SILENCE]) * 160, "PCMA": bytes([ALAW_SILENCE]) * 160}
LAW = {"PCMU": "pcmu", "PCMA": "pcma"}


def config(call_id: str, codec: str) -> MediaCallConfig:
    return MediaCallConfig(
        call_id=call_id,
        codec=codec,  # type: ignore[arg-type]
        payload_type=0 if codec == "PCMU" else 8,
        remote_rtp=PEER,
        ssrc=1000 + sum(call_id.encode()),
        initial_sequence=100,
        initial_timestamp=0,
    )


def engine_with(*calls: tuple[str, str]) -> TickEngine:
    engine = TickEngine()
    for call_id, codec in calls:
        engine.add_call(config(call_id, codec), now=0.0)
    return engine


def payloads(engine: TickEngine, outbound: dict[str, OutboundFrame], now: float) -> dict[str, bytes]:
    return {call_id: parse_rtp(data).payload for call_id, _, data in engine.tick_outbound(outbound, now)}


def speech24(frames: int, seed: int) -> list[npt.NDArray[np.int16]]:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME_SAMPLES) / 24000
    x = 7000 * np.sin(2 * np.pi * (300 + 40 * seed) * t) + rng.normal(0, 800, t.size)
    signal = x.astype(np.int16)
    return [signal[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES] for k in range(frames)]


def codes_of(law: str, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, 160, dtype=np.uint8).tobytes() for _ in range(count)]


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
@pytest.mark.parametrize("kind", ["G711Frame", "Frame with codes"])
def test_same_law_codes_are_the_rtp_payload_byte_for_byte(codec: str, kind: str) -> None:
    engine = engine_with(("c1", codec))
    law = LAW[codec]
    for k, codes in enumerate(codes_of(law, 6, seed=1)):
        frame: OutboundFrame
        if kind == "G711Frame":
            frame = G711Frame(index=k, g711=codes, g711_law=law)  # type: ignore[arg-type]
        else:  # PCM that is not the codes' audio: the tick must send the codes, not re-encode the PCM
            frame = Frame(index=k, pcm=np.full(FRAME_SAMPLES, 1234, np.int16), g711=codes, g711_law=law)  # type: ignore[arg-type]
        assert payloads(engine, {"c1": frame}, k * 0.02) == {"c1": codes}


@pytest.mark.parametrize(("codec", "other"), [("PCMU", "pcma"), ("PCMA", "pcmu")])
def test_other_law_codes_go_through_the_tables(codec: str, other: str) -> None:
    engine = engine_with(("c1", codec))
    every_code = bytes(range(256)) + bytes(range(64))  # each code at least once, in two frames
    frames = [every_code[:160], every_code[160:320]]
    decode_other = alaw_decode if other == "pcma" else ulaw_decode
    for k, codes in enumerate(frames):
        got = payloads(engine, {"c1": G711Frame(index=k, g711=codes, g711_law=other)}, k * 0.02)  # type: ignore[arg-type]
        assert got["c1"] == ENCODE[codec](decode_other(codes)), "decoded in the provider's law, encoded in the call's"


def test_a_mixed_tick_resamples_only_pcm_rows_and_each_stays_a_continuous_stream() -> None:
    """Four calls per law: PCM, codes, silence, and a call alternating PCM and silence; every PCM row must be
    bit-identical to its own StreamResampler fed exactly its PCM frames and silence."""
    calls = [(f"{kind}-{codec}", codec) for codec in ("PCMA", "PCMU") for kind in ("pcm", "codes", "none", "alt")]
    engine = engine_with(*calls)
    streams = {call_id: StreamResampler(24000, 8000) for call_id, _ in calls}
    zero = np.zeros(FRAME_SAMPLES, np.int16)
    for k in range(12):
        outbound: dict[str, OutboundFrame] = {}
        expected: dict[str, bytes] = {}
        for n, (call_id, codec) in enumerate(calls):
            kind = call_id.split("-")[0]
            pcm = speech24(1, seed=100 * k + n)[0]
            if kind == "pcm" or (kind == "alt" and k % 3 != 2):
                outbound[call_id] = Frame(index=k, pcm=pcm)
                expected[call_id] = ENCODE[codec](streams[call_id].process(pcm))
            elif kind == "codes":
                codes = codes_of("", 1, seed=k + n)[0]
                outbound[call_id] = G711Frame(index=k, g711=codes, g711_law=LAW[codec])  # type: ignore[arg-type]
                expected[call_id] = codes
            else:
                expected[call_id] = ENCODE[codec](streams[call_id].process(zero))
                outbound[call_id] = None
        assert payloads(engine, outbound, k * 0.02) == expected, f"tick {k}"
        if k >= 1:
            assert expected["none-PCMU"] == SILENCE["PCMU"] and expected["none-PCMA"] == SILENCE["PCMA"]


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
def test_pcm_after_code_frames_matches_a_fresh_resampler_and_silence_stays_silence(codec: str) -> None:
    engine = engine_with(("c1", codec))
    law = LAW[codec]
    first, second = speech24(5, seed=1), speech24(5, seed=2)
    continuous = StreamResampler(24000, 8000)
    at = 0.0

    def send(frame: OutboundFrame) -> bytes:
        nonlocal at
        at += 0.02
        return payloads(engine, {"c1": frame}, at)["c1"]

    assert [send(Frame(index=k, pcm=p)) for k, p in enumerate(first)] == [
        ENCODE[codec](continuous.process(p)) for p in first
    ]
    codes = codes_of(law, 4, seed=3)
    assert [send(G711Frame(index=5 + k, g711=c, g711_law=law)) for k, c in enumerate(codes)] == codes  # type: ignore[arg-type]
    assert send(None) == SILENCE[codec], "silence after code frames is silence codes, not the stale PCM tail"
    fresh = StreamResampler(24000, 8000)
    after = [send(Frame(index=10 + k, pcm=p)) for k, p in enumerate(second)]
    assert after == [ENCODE[codec](fresh.process(p)) for p in second], "no history from before the code frames"
    stale = StreamResampler(24000, 8000)
    for p in first:
        stale.process(p)
    assert ENCODE[codec](stale.process(second[0])) != after[0], "the test can tell a stale history apart"
    # Codes right after PCM, then PCM again without a silent tick between.
    send(G711Frame(index=15, g711=codes[0], g711_law=law))  # type: ignore[arg-type]
    fresh = StreamResampler(24000, 8000)
    assert send(Frame(index=16, pcm=first[0])) == ENCODE[codec](fresh.process(first[0]))


def test_silence_after_pcm_plays_the_filter_tail_then_is_silence_codes() -> None:
    engine = engine_with(("c1", "PCMU"))
    stream = StreamResampler(24000, 8000)
    zero = np.zeros(FRAME_SAMPLES, np.int16)
    loud = speech24(3, seed=4)
    for k, p in enumerate(loud):
        assert payloads(engine, {"c1": Frame(index=k, pcm=p)}, k * 0.02)["c1"] == ulaw_encode(stream.process(p))
    tail = payloads(engine, {"c1": None}, 0.06)["c1"]
    assert tail == ulaw_encode(stream.process(zero)) and tail != SILENCE["PCMU"], "the last frame's tail plays out"
    for k in range(3):
        assert payloads(engine, {}, 0.08 + k * 0.02)["c1"] == SILENCE["PCMU"] == ulaw_encode(stream.process(zero))
    again = speech24(2, seed=5)
    for k, p in enumerate(again):
        got = payloads(engine, {"c1": Frame(index=3 + k, pcm=p)}, 0.2 + k * 0.02)["c1"]
        assert got == ulaw_encode(stream.process(p)), "a row that skipped silence is still one continuous stream"


@settings(max_examples=30, deadline=None)
@given(plan=st.lists(st.sampled_from(["pcm", "codes", "none"]), min_size=1, max_size=30))
def test_any_sequence_of_frame_kinds_matches_a_reference_stream(plan: list[str]) -> None:
    """Reference: PCM and silence go through one resampler, which starts afresh after code frames."""
    engine = engine_with(("c1", "PCMA"))
    reference = StreamResampler(24000, 8000)
    zero = np.zeros(FRAME_SAMPLES, np.int16)
    pcm = speech24(len(plan), seed=6)
    after_codes = False
    for k, kind in enumerate(plan):
        if kind == "codes":
            codes = codes_of("", 1, seed=k)[0]
            got = payloads(engine, {"c1": G711Frame(index=k, g711=codes, g711_law="pcma")}, k * 0.02)["c1"]
            assert got == codes
            after_codes = True
            continue
        if after_codes:
            reference.reset()
            after_codes = False
        frame = Frame(index=k, pcm=pcm[k]) if kind == "pcm" else None
        got = payloads(engine, {"c1": frame}, k * 0.02)["c1"]
        assert got == alaw_encode(reference.process(pcm[k] if kind == "pcm" else zero)), (k, plan)


def test_rtp_marks_code_frames_as_audio() -> None:
    engine = engine_with(("c1", "PCMU"))
    codes = codes_of("", 3, seed=7)
    packets = []
    for k, frame in enumerate([None, G711Frame(index=1, g711=codes[0], g711_law="pcmu"), None]):
        ((_, _, data),) = engine.tick_outbound({"c1": frame}, k * 0.02)
        packets.append(parse_rtp(data))
    assert [p.marker for p in packets] == [True, True, False], "a talkspurt starts with the first code frame"


def test_g711_frame_checks_its_shape() -> None:
    with pytest.raises(FrameError):
        G711Frame(index=0, g711=b"\xff" * 159, g711_law="pcmu")
    with pytest.raises(FrameError):
        G711Frame(index=0, g711=b"\xff" * 160, g711_law="l16")  # type: ignore[arg-type]
    with pytest.raises(FrameError):
        G711Frame(index=-1, g711=b"\xff" * 160, g711_law="pcma")
