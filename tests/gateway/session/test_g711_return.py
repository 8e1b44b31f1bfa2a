"""G.711 passthrough, the return half: a provider's G.711 audio reaches a G.711 caller as the provider's codes
(session -> tick -> RTP payload), with no resampling, while a PCM caller still gets exact 24 kHz audio."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.media.call import MediaCallConfig
from gateway.media.rtp import parse_rtp
from gateway.media.tick import G711Frame, TickEngine
from gateway.providers.base import AgentProfile, AudioDone, AudioReceived, ResponseStarted, SpeechStarted
from gateway.session import CallSession
from gateway.session.g711 import G711Playback
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.resample import StreamResampler
from tests.gateway.session.fakes import FakeModel, FakeRealtimeSession, drained, make_session

DECODE = {"pcmu": ulaw_decode, "pcma": alaw_decode}
SILENCE = {"pcmu": ULAW_SILENCE, "pcma": ALAW_SILENCE}


def provider_codes(count: int, law: str, *, seed: int = 5) -> bytes:
    """Codes of a speech-like 8 kHz signal (random codes would be noise at full scale)."""
    rng = np.random.default_rng(seed)
    t = np.arange(count) / 8000
    x = (6000 * np.sin(2 * np.pi * 350 * t) + rng.normal(0, 500, count)).astype(np.int16)
    return (ulaw_encode if law == "pcmu" else alaw_encode)(x)


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, at = [], 0
    for size in sizes:
        chunks.append(data[at : at + size])
        at += size
    return [c for c in [*chunks, data[at:]] if c]


async def g711_session(law: str) -> tuple[CallSession, FakeRealtimeSession]:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="g711", audio_format=law))  # type: ignore[arg-type]
    await session.start()
    return session, model.last


def engine_for(codec: str) -> TickEngine:
    engine = TickEngine()
    engine.add_call(
        MediaCallConfig(
            call_id="c1",
            codec=codec,  # type: ignore[arg-type]
            payload_type=0 if codec == "PCMU" else 8,
            remote_rtp=("192.0.2.10", 4000),
            ssrc=4321,
            initial_sequence=1,
            initial_timestamp=0,
        ),
        now=0.0,
    )
    return engine


@pytest.mark.parametrize(
    ("provider", "caller"), [("pcmu", "PCMU"), ("pcma", "PCMA"), ("pcmu", "PCMA"), ("pcma", "PCMU")]
)
async def test_the_caller_gets_the_providers_codes_end_to_end(provider: str, caller: str) -> None:
    session, fake = await g711_session(provider)
    audio = provider_codes(1000, provider)
    fake.emit(ResponseStarted(response_id="r1"))
    for chunk in split(audio, [77, 160, 301, 2, 250]):  # part-frames carried across deltas
        fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=chunk))
    fake.emit(AudioDone(response_id="r1", item_id="i1"))
    await drained(session, fake)
    engine = engine_for(caller)
    sent = []
    for k in range(8):
        frame = session.pull_outbound(takes_g711=True)
        if k < 7:
            assert isinstance(frame, G711Frame) and frame.index == k and frame.g711_law == provider
        else:
            assert frame is None
        ((_, _, datagram),) = engine.tick_outbound({"c1": frame}, k * 0.02)
        sent.append(parse_rtp(datagram).payload)
    expected = audio + bytes([SILENCE[provider]]) * (7 * 160 - 1000)  # the last part-frame completed
    if provider != caller.lower():
        encode = ulaw_encode if caller == "PCMU" else alaw_encode
        expected = encode(DECODE[provider](expected))  # through the tables, sample for sample
    assert b"".join(sent[:7]) == expected
    assert sent[7] == bytes([SILENCE[caller.lower()]]) * 160
    await session.aclose()


async def test_barge_in_truncates_at_the_codes_actually_sent() -> None:
    session, fake = await g711_session("pcmu")
    fake.emit(ResponseStarted(response_id="r1"))
    for chunk in split(provider_codes(8000, "pcmu"), [333, 1234, 999]):  # 1 s of audio
        fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=chunk))
    await drained(session, fake)
    pulled = [session.pull_outbound(takes_g711=True) for _ in range(13)]
    assert all(isinstance(f, G711Frame) for f in pulled)
    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    assert session.pull_outbound(takes_g711=True) is None, "the very next tick is silent"
    sent = await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert sent == [("truncate", "i1", 0, 260)], "13 frames of 160 codes = 260 ms"
    await session.aclose()


async def test_barge_in_inside_the_last_part_frame_counts_only_its_real_codes() -> None:
    session, fake = await g711_session("pcma")
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=provider_codes(160 * 3 + 40, "pcma")))
    fake.emit(AudioDone(response_id="r1", item_id="i1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i2", pcm=provider_codes(800, "pcma")))
    await drained(session, fake)
    for _ in range(5):  # i1: 3 whole frames and its 5 ms tail; then one frame of i2
        assert isinstance(session.pull_outbound(takes_g711=True), G711Frame)
    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    sent = await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert sent == [("truncate", "i2", 0, 20)], "i1 was heard to its end (65 ms); i2 for 20 ms"
    await session.aclose()


async def test_a_pcm_caller_gets_exact_24k_audio_of_the_codes() -> None:
    """A browser (WebRTC) caller on a pcmu profile: pull_outbound() without takes_g711 gives Frames whose
    PCM is the codes decoded and resampled as one stream, exactly as a fresh StreamResampler does."""
    session, fake = await g711_session("pcmu")
    audio = provider_codes(160 * 6, "pcmu")
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=audio[:500]))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=audio[500:]))
    fake.emit(AudioDone(response_id="r1", item_id="i1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i2", pcm=audio[:160]))
    fake.emit(AudioDone(response_id="r1", item_id="i2"))
    await drained(session, fake)
    up = StreamResampler(8000, 24000)
    for k in range(7):
        frame = session.pull_outbound()
        assert isinstance(frame, Frame) and frame.pcm.shape == (FRAME_SAMPLES,)
        codes = audio[(k % 6) * 160 : (k % 6 + 1) * 160]
        assert frame.g711 == codes and frame.g711_law == "pcmu"
        assert np.array_equal(frame.pcm, up.process(ulaw_decode(codes))), f"frame {k}"
    assert session.pull_outbound() is None
    # After silence the stream starts afresh: equal to a new resampler, which a stale one is not.
    fake.emit(AudioReceived(response_id="r1", item_id="i3", pcm=audio[160:320]))
    await drained(session, fake)
    frame = session.pull_outbound()
    assert isinstance(frame, Frame)
    assert np.array_equal(frame.pcm, StreamResampler(8000, 24000).process(ulaw_decode(audio[160:320])))
    assert not np.array_equal(frame.pcm, up.process(ulaw_decode(audio[160:320])))
    await session.aclose()


async def test_a_profile_change_from_codes_to_pcm_leaves_no_stale_resampler_state() -> None:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="g711", audio_format="pcmu"))
    await session.start()
    engine = engine_for("PCMU")
    first = model.last
    codes = provider_codes(160 * 4, "pcmu")
    first.emit(ResponseStarted(response_id="r1"), AudioReceived(response_id="r1", item_id="i1", pcm=codes))
    await drained(session, first)
    at = 0.0

    def tick() -> bytes:
        nonlocal at
        at += 0.02
        frame = session.pull_outbound(takes_g711=True)
        ((_, _, datagram),) = engine.tick_outbound({"c1": frame}, at)
        return parse_rtp(datagram).payload

    assert b"".join(tick() for _ in range(2)) == codes[:320]
    await session.update_profile(AgentProfile(name="pcm"))  # pcm24k from here on
    second = model.last
    rng = np.random.default_rng(9)
    pcm = (rng.normal(0, 4000, FRAME_SAMPLES * 3)).astype("<i2")
    second.emit(ResponseStarted(response_id="r2"), AudioReceived(response_id="r2", item_id="j1", pcm=pcm.tobytes()))
    await drained(session, second)
    assert b"".join(tick() for _ in range(2)) == codes[320:], "the old item's codes play out first"
    fresh = StreamResampler(24000, 8000)
    after = [tick() for _ in range(3)]
    assert after == [ulaw_encode(fresh.process(pcm[k * 480 : (k + 1) * 480])) for k in range(3)]
    await session.aclose()


def test_playback_is_one_stream_for_consecutive_frames_and_fresh_after_a_gap() -> None:
    playback = G711Playback()
    a, b = provider_codes(480, "pcma", seed=1), provider_codes(160, "pcmu", seed=2)
    up = StreamResampler(8000, 24000)
    for k in range(3):
        part = a[k * 160 : (k + 1) * 160]
        out = playback.pcm(part, "pcma", index=10 + k)
        assert np.array_equal(out, up.process(alaw_decode(part))) and not out.flags.writeable
    out = playback.pcm(b, "pcmu", index=14)  # index 13 was something else
    assert np.array_equal(out, StreamResampler(8000, 24000).process(ulaw_decode(b)))
