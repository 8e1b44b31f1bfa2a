"""Barge-in: playback stops within the tick, and truncation points at exactly what the caller was sent."""

from __future__ import annotations

from gateway.providers.base import (
    AudioDone,
    AudioReceived,
    Capabilities,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
)
from gateway.session import CallState, LocalVadConfig
from gateway.session.events import BargedIn
from tests.gateway.session.fakes import (
    FakeClock,
    FakeModel,
    drained,
    fast_config,
    make_session,
    pcm_ms,
    tone_frame,
    wait_event,
)


def _split(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, at = [], 0
    for size in sizes:
        chunks.append(data[at : at + size])
        at += size
    chunks.append(data[at:])
    return [c for c in chunks if c]


async def test_truncate_at_exactly_the_frames_pulled() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    audio = pcm_ms(3000)
    fake.emit(ResponseStarted(response_id="r1"))
    # Odd-sized deltas: partial frames are carried across deltas of the item.
    for chunk in _split(audio, [333, 1234, 7777, 10_002, 4242]):
        fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=chunk))
    await drained(session, fake)
    pulled = [session.pull_outbound() for _ in range(37)]
    assert all(frame is not None for frame in pulled)
    played = b"".join(frame.to_bytes() for frame in pulled if frame is not None)
    assert played == audio[: 37 * 960], "frames are the provider's audio, in order, byte for byte"
    assert [frame.index for frame in pulled if frame is not None] == list(range(37))

    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    assert session.pull_outbound() is None, "the very next tick is silent"
    sent = await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert sent == [("truncate", "i1", 0, 740)]
    assert fake.of("cancel_response") == [("cancel_response",)]
    assert fake.sent.index(("cancel_response",)) < fake.sent.index(("truncate", "i1", 0, 740))
    event = await wait_event(session, lambda e: isinstance(e, BargedIn))
    assert event.items[0].sent_ms == 740 and event.items[0].received_ms == 3000
    assert event.trigger == "speech_started" and event.cancelled and event.truncated

    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(500)))
    await drained(session, fake)
    assert session.pull_outbound() is None, "late deltas of the cancelled response are dropped"
    assert session.stats().barge_ins == 1
    await session.aclose()


async def test_padded_tail_counts_only_real_samples_and_a_fully_heard_item_is_not_truncated() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(730)))  # 36.5 frames
    await drained(session, fake)
    frames = [session.pull_outbound() for _ in range(40)]
    assert sum(frame is not None for frame in frames) == 36, "the half frame waits for more of its item"
    fake.emit(AudioReceived(response_id="r1", item_id="i2", pcm=pcm_ms(100)))  # a second item starts
    await drained(session, fake)
    tail = session.pull_outbound()
    assert tail is not None and tail.pcm[:240].any() and not tail.pcm[240:].any(), "tail padded with silence"
    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    event = await wait_event(session, lambda e: isinstance(e, BargedIn))
    # i1 was heard to its end (730 ms of 730): nothing to truncate; i2 was never played: deleted.
    assert [(i.item_id, i.sent_ms, i.received_ms) for i in event.items] == [("i2", 0, 100)]
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "delete"])
    assert fake.of("delete") == [("delete", "i2")] and fake.of("truncate") == []
    assert fake.of("cancel_response") == [("cancel_response",)]
    await session.aclose()


async def test_delete_when_nothing_was_played() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(400)))
    await drained(session, fake)
    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    assert session.pull_outbound() is None
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "delete"])
    assert fake.of("delete") == [("delete", "i1")]
    assert fake.of("truncate") == []
    await session.aclose()


async def test_speech_while_agent_quiet_is_not_a_barge_in() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(SpeechStarted(item_id="u1"), SpeechStopped(item_id="u1"))
    await drained(session, fake)
    assert session.stats().barge_ins == 0
    assert fake.of("cancel_response") == [] and fake.of("truncate") == []
    await session.aclose()


async def test_response_finished_but_audio_still_playing_truncates_without_cancel() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(1000)))
    fake.emit(AudioDone(response_id="r1", item_id="i1"), ResponseDone(response_id="r1", status="completed"))
    await drained(session, fake)
    for _ in range(5):
        session.pull_outbound()
    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert fake.of("truncate") == [("truncate", "i1", 0, 100)]
    assert fake.of("cancel_response") == [], "no response is running any more"
    await session.aclose()


async def test_provider_interruption_without_truncate_capability() -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=False, resume_handle=True))
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="g1"))
    fake.emit(AudioReceived(response_id="g1", item_id="g1", pcm=pcm_ms(600)))
    await drained(session, fake)
    assert session.pull_outbound() is not None
    fake.emit(ResponseInterrupted())
    await drained(session, fake)
    assert session.pull_outbound() is None
    event = await wait_event(session, lambda e: isinstance(e, BargedIn))
    assert event.trigger == "provider_interrupted" and not event.cancelled and not event.truncated
    assert fake.of("cancel_response") == [] and fake.of("truncate") == [] and fake.of("delete") == []
    await session.aclose()


async def test_local_vad_barges_in_within_the_tick_when_the_provider_has_no_vad() -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=False, truncate=True))
    config = fast_config(local_vad=LocalVadConfig(threshold_dbfs=-30.0, start_ms=40, hangover_ms=100))
    session, _ = make_session(model, config=config)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(2000)))
    await drained(session, fake)
    for index in range(10):
        session.push_inbound(tone_frame(index, level=50))  # quiet line noise: no barge-in
        assert session.pull_outbound() is not None
    session.push_inbound(tone_frame(10, level=8000))
    assert session.pull_outbound() is not None, "one loud frame is not yet speech"
    session.push_inbound(tone_frame(11, level=8000))
    assert session.pull_outbound() is None, "speech detected: silent in the same tick"
    sent = await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert sent == [("truncate", "i1", 0, 220)]
    assert session.stats().barge_ins == 1
    await session.aclose()


async def test_round_trip_latency_is_speech_end_to_first_agent_frame_sent() -> None:
    clock = FakeClock()
    model = FakeModel()
    session, _ = make_session(model, clock=clock)
    await session.start()
    fake = model.last
    fake.emit(SpeechStarted(item_id="u1"), SpeechStopped(item_id="u1"))
    await drained(session, fake)
    clock.advance(0.2)
    fake.emit(ResponseStarted(response_id="r1"), AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(100)))
    await drained(session, fake)
    clock.advance(0.15)
    assert session.pull_outbound() is not None
    clock.advance(0.02)
    assert session.pull_outbound() is not None
    stats = session.stats()
    assert stats.round_trips == 1
    assert stats.round_trip_ms_last is not None and abs(stats.round_trip_ms_last - 350.0) < 1e-6
    assert stats.frames_out == 2
    assert session.state is CallState.ACTIVE
    await session.aclose()
