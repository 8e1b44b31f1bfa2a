"""The echo agent: byte-identical, continuous, ordered echo through the provider interface; DTMF; cheapness."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    ProviderDisconnected,
    RealtimeModel,
    RealtimeSession,
    ResponseDone,
    ResponseStarted,
    SessionStarted,
    TranscriptReceived,
)
from gateway.providers.echo import EchoConfig, EchoModel, EchoSession
from gateway.providers.errors import ProviderClosedError, ProviderConnectError
from tests.gateway.providers.helpers import EventReader, noise_frames

pytestmark = pytest.mark.timeout(30)


def drain(session: EchoSession) -> list[object]:
    """Everything queued right now (the echo agent is synchronous underneath)."""
    events = list(session._events)
    session._events.clear()
    return events


async def test_echo_is_byte_identical_ordered_and_one_frame_behind() -> None:
    model = EchoModel()
    assert isinstance(model, RealtimeModel)
    assert model.capabilities.server_vad is True  # no local VAD: it would cancel the caller's own echo
    session = await model.connect(AgentProfile())
    assert isinstance(session, RealtimeSession)
    events = EventReader(session.events())
    assert await events.next() == SessionStarted(session_id="echo_1", resumed=False)
    frames = noise_frames(120, seed=7)
    await session.send_audio(frames[0])
    assert not session._events  # held back one frame
    for frame in frames[1:]:
        await session.send_audio(frame)
    await session.aclose()
    await events.until(ProviderDisconnected)
    audio = events.of(AudioReceived)
    assert [a.pcm for a in audio] == frames[:-1]  # the last frame was still held back when the call ended
    # 50-frame items, each a complete response; item boundaries leave no gap in the audio.
    assert [len([a for a in audio if a.item_id == item]) for item in dict.fromkeys(a.item_id for a in audio)] == [
        50,
        50,
        19,
    ]
    assert len(events.of(ResponseStarted)) == len(events.of(ResponseDone)) == len(events.of(AudioDone)) == 3
    assert [d.status for d in events.of(ResponseDone)] == ["completed", "completed", "cancelled"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=30), st.integers(0, 3))
def test_any_chunking_echoes_the_same_bytes(chunk_sizes: list[int], delay: int) -> None:
    async def scenario() -> None:
        session = await EchoModel(EchoConfig(delay_frames=delay, item_frames=7)).connect(AgentProfile())
        stream = b"".join(bytes([i % 251]) * n for i, n in enumerate(chunk_sizes))
        stream = stream[: len(stream) - len(stream) % 2]
        offset = 0
        for n in chunk_sizes:
            await session.send_audio(stream[offset : offset + n])
            offset += n
        echoed = b"".join(e.pcm for e in drain(session) if isinstance(e, AudioReceived))
        whole_frames = len(stream) // 960
        assert echoed == stream[: max(0, whole_frames - delay) * 960]

    asyncio.run(scenario())


async def test_delay_zero_echoes_within_the_same_call() -> None:
    session = await EchoModel(EchoConfig(delay_frames=0)).connect(AgentProfile())
    drain(session)
    frame = noise_frames(1, seed=1)[0]
    await session.send_audio(frame)
    events = drain(session)
    assert isinstance(events[0], ResponseStarted)
    assert isinstance(events[1], AudioReceived) and events[1].pcm == frame


async def test_dtmf_text_is_answered() -> None:
    session = await EchoModel().connect(AgentProfile())
    drain(session)
    await session.send_text("DTMF 5")
    await session.send_text("dtmf #")
    await session.send_text("hello")
    texts = [e.text for e in drain(session) if isinstance(e, TranscriptReceived)]
    assert texts == ["You pressed 5", "You pressed #"]


async def test_cancel_drops_held_audio_and_ends_the_item() -> None:
    session = await EchoModel(EchoConfig(delay_frames=2)).connect(AgentProfile())
    drain(session)
    frames = noise_frames(5, seed=2)
    for frame in frames:
        await session.send_audio(frame)
    await session.cancel_response()
    events = drain(session)
    assert [e.pcm for e in events if isinstance(e, AudioReceived)] == frames[:3]
    assert isinstance(events[-1], ResponseDone) and events[-1].status == "cancelled"
    await session.send_audio(frames[0])
    assert drain(session) == []  # held again behind the 2-frame delay


async def test_create_response_and_closed_session() -> None:
    session = await EchoModel().connect(AgentProfile())
    drain(session)
    await session.create_response(instructions="Hello from echo")
    events = drain(session)
    assert [type(e) for e in events] == [ResponseStarted, TranscriptReceived, ResponseDone]
    await session.aclose()
    await session.aclose()
    with pytest.raises(ProviderClosedError):
        await session.send_audio(bytes(960))
    with pytest.raises(ProviderConnectError):
        await EchoModel().connect(AgentProfile(audio_format="pcmu"))


async def test_slow_reader_loses_oldest_audio_not_control_events() -> None:
    session = await EchoModel(EchoConfig(delay_frames=0, queue_frames=20, item_frames=1000)).connect(AgentProfile())
    for frame in noise_frames(100, seed=3):
        await session.send_audio(frame)
    events = list(session._events)
    assert len(events) == 20
    assert isinstance(events[0], SessionStarted) and isinstance(events[1], ResponseStarted)
    assert session.dropped_events == 100 + 2 - 20


async def test_hundreds_of_sessions_run_no_task_of_their_own() -> None:
    # What a session costs per frame is measured by `gateway bench calls`; here: 500 sessions fed a second of
    # audio each echo it from the caller's own send, with no timer or task per session.
    model = EchoModel()
    sessions = [await model.connect(AgentProfile()) for _ in range(500)]
    frame = bytes(960)
    echoed = 0
    for _ in range(50):  # one second of audio for 500 calls
        for session in sessions:
            await session.send_audio(frame)
            echoed += sum(isinstance(event, AudioReceived) for event in session._events)
            session._events.clear()
    assert echoed == 500 * 49, echoed  # every frame but the one still held (delay_frames=1)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("echo")]
