"""Component faults heal inside the pipeline session; only a component down past its deadline ends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from gateway.providers.base import (
    AgentProfile,
    AudioReceived,
    ProviderDisconnected,
    ProviderErrored,
    ResponseDone,
    SessionStarted,
    TranscriptReceived,
)
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.pipeline.chat import ChatConfig, OpenAICompatibleChat
from gateway.providers.pipeline.ports import SttFailed, TtsAudio, TtsEvent, TtsFailed
from gateway.providers.pipeline.session import PipelineSession, SessionOptions
from gateway.providers.pipeline.synthetic import ScriptedStt, SyntheticStream, SyntheticTts
from gateway.providers.pipeline.vad import EnergyDetector
from tests.gateway.providers.pipeline.test_session import Reader

FRAME = bytes(960)


class RecordingStt(ScriptedStt):
    """A scripted recogniser that records what it was fed and can be made to fail."""

    def __init__(self) -> None:
        super().__init__(texts=("hello",))
        self.fed: list[bytes] = []

    def feed(self, pcm: bytes) -> None:
        self.fed.append(pcm)
        super().feed(pcm)

    def fail(self, *, retryable: bool = True) -> None:
        self._put(SttFailed(message="socket dropped", retryable=retryable))


class FailingOnceTts(SyntheticTts):
    """The first stream fails after its first audio; later streams work."""

    async def open(self, utterance_id: str, *, voice: str = "") -> SyntheticStream:
        stream = await super().open(utterance_id, voice=voice)
        if self.opened == 1:
            return _FailAfterAudio(stream)  # type: ignore[return-value]
        return stream


class _FailAfterAudio:
    def __init__(self, inner: SyntheticStream) -> None:
        self.inner = inner
        self.timestamps = inner.timestamps

    async def push(self, text: str) -> None:
        await self.inner.push(text)

    async def flush(self) -> None:
        await self.inner.flush()

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def events(self) -> AsyncIterator[TtsEvent]:
        async for event in self.inner.events():
            yield event
            if isinstance(event, TtsAudio):
                yield TtsFailed(message="context dropped", retryable=True)
                return


def session_with(
    chat_url: str, *, stt: ScriptedStt, open_stt: object, tts: SyntheticTts, **options: object
) -> PipelineSession:
    session = PipelineSession(
        profile=AgentProfile(provider="pipeline", instructions=""),
        stt=stt,
        open_stt=open_stt,  # type: ignore[arg-type]
        chat=OpenAICompatibleChat(ChatConfig(url=chat_url, model="m")),
        tts=tts,
        vad=EnergyDetector(),
        options=SessionOptions(**options),  # type: ignore[arg-type]
    )
    session.start()
    return session


async def test_a_dropped_recogniser_reconnects_and_gets_the_audio_held_meanwhile() -> None:
    first, second = RecordingStt(), RecordingStt()
    release = asyncio.Event()

    async def reopen() -> RecordingStt:
        await release.wait()
        return second

    async with FakeChatServer() as fake:
        session = session_with(fake.url, stt=first, open_stt=reopen, tts=SyntheticTts())
        reader = Reader(session.events())
        first.fail()
        await reader.until(SessionStarted, within_s=1.0)
        await asyncio.wait_for(_until(lambda: session._stt_hold is not None), 2.0)
        held = [bytes([i]) * 960 for i in range(1, 6)]
        for frame in held:
            session.send_audio_nowait(frame)
        release.set()
        await asyncio.wait_for(_until(lambda: session._stt is second and session._stt_hold is None), 2.0)
        session.send_audio_nowait(FRAME)
        assert second.fed == [*held, FRAME] and not any(f in first.fed for f in held)
        await session.aclose()


async def test_a_recogniser_down_past_the_deadline_ends_the_session_retryably() -> None:
    async def refuse() -> RecordingStt:
        raise ConnectionRefusedError("no route")

    async with FakeChatServer() as fake:
        stt = RecordingStt()
        session = session_with(fake.url, stt=stt, open_stt=refuse, tts=SyntheticTts(), component_deadline_s=0.3)
        reader = Reader(session.events())
        stt.fail()
        error = await reader.until(ProviderErrored, within_s=3.0)
        assert error.code == "stt_down" and error.fatal
        last = await reader.until(ProviderDisconnected)
        assert last.retryable and "stt unavailable" in last.reason
        await session.aclose()
        # The session still released everything after the component ended it.
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(f"pipeline-{session.session_id}-")]


async def test_a_bad_key_is_not_retryable() -> None:
    async with FakeChatServer() as fake:
        stt = RecordingStt()
        session = session_with(fake.url, stt=stt, open_stt=RecordingStt, tts=SyntheticTts())
        reader = Reader(session.events())
        stt.fail(retryable=False)
        last = await reader.until(ProviderDisconnected, within_s=3.0)
        assert not last.retryable
        await session.aclose()


async def test_a_dropped_tts_stream_is_reopened_and_speaks_the_rest_of_the_item() -> None:
    tts = FailingOnceTts(ms_per_char=10)
    async with FakeChatServer([ScriptedReply(text="Alpha beta gamma. Delta epsilon zeta.")]) as fake:
        session = session_with(fake.url, stt=RecordingStt(), open_stt=RecordingStt, tts=tts)
        reader = Reader(session.events())
        await session.create_response()
        done = await reader.until(ResponseDone, within_s=5.0)
        assert done.status == "completed" and tts.opened == 2
        final = [e for e in reader.seen if isinstance(e, TranscriptReceived) and e.final]
        assert final[-1].text == "Alpha beta gamma. Delta epsilon zeta."
        assert sum(len(e.pcm) for e in reader.seen if isinstance(e, AudioReceived)) > 0
        await session.aclose()


async def test_an_unread_event_queue_overflows_into_an_explicit_disconnect() -> None:
    async with FakeChatServer([ScriptedReply(text="word " * 200)]) as fake:
        session = session_with(
            fake.url, stt=RecordingStt(), open_stt=RecordingStt, tts=SyntheticTts(), event_queue_size=16
        )
        await session.create_response()
        await asyncio.wait_for(_until(lambda: session._ended), 5.0)
        events = [session._events.get_nowait() for _ in range(session._events.qsize())]
        assert isinstance(events[-1], ProviderDisconnected) and events[-1].retryable
        assert "overflow" in events[-1].reason
        await session.aclose()


async def _until(predicate: Callable[[], bool]) -> None:
    """Poll session state no event announces (the callers bound it with a deadline)."""
    while not predicate():  # noqa: ASYNC110 (internal state, no event to wait for)
        await asyncio.sleep(0.005)


class _BrokenTts(SyntheticTts):
    async def open(self, utterance_id: str, *, voice: str = "") -> SyntheticStream:
        stream = await super().open(utterance_id, voice=voice)

        async def push(text: str) -> None:
            raise RuntimeError("adapter bug")

        stream.push = push  # type: ignore[method-assign]
        return stream


async def test_a_component_that_raises_fails_the_reply_and_the_session_goes_on() -> None:
    async with FakeChatServer([ScriptedReply(text="Hello there. Bye."), ScriptedReply(text="Again.")]) as fake:
        session = session_with(fake.url, stt=RecordingStt(), open_stt=RecordingStt, tts=_BrokenTts())
        reader = Reader(session.events())
        await session.create_response()
        done = await reader.until(ResponseDone, within_s=5.0)
        assert done.status == "failed"
        error = next(e for e in reader.seen if isinstance(e, ProviderErrored))
        assert error.code == "reply_failed" and "adapter bug" in error.message and not error.fatal
        await session.send_text("still usable")
        await session.aclose()
