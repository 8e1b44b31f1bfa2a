"""Playout markers: a provider's AudioMarked is called back in the tick that takes the last frame holding audio
from before it, at once on an empty playout, as cleared on a barge-in, and never for a connection that went away.
Caller DTMF reaches a KeypadSession as a keypress."""

from __future__ import annotations

from typing import Literal

from gateway.providers.base import (
    AudioDone,
    AudioMarked,
    AudioReceived,
    Capabilities,
    ResponseInterrupted,
    ResponseStarted,
)
from gateway.session.events import BargedIn, DtmfReceived
from gateway.session.playout import PlayoutBuffer
from tests.gateway.session.fakes import (
    FakeModel,
    FakeRealtimeSession,
    drained,
    make_session,
    of_type,
    pcm_ms,
    wait_event,
)


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, marker: str, cleared: bool) -> None:
        self.calls.append((marker, cleared))

    def mark(self, name: str) -> AudioMarked:
        return AudioMarked(marker=name, reached=self)


def _add(buffer: PlayoutBuffer, ms: int, *, item: str = "i1", response: str = "r1") -> None:
    buffer.add(response_id=response, item_id=item, content_index=0, pcm=pcm_ms(ms))


def test_marker_on_an_empty_playout_is_due_at_once() -> None:
    calls = Calls()
    buffer = PlayoutBuffer()
    buffer.mark(calls.mark("m0"))
    assert buffer.markers_due
    due, cleared = buffer.take_markers()
    assert [m.marker for m in due] == ["m0"] and cleared == []
    assert not buffer.markers_due


def test_marker_is_due_when_the_last_frame_before_it_is_taken() -> None:
    calls = Calls()
    buffer = PlayoutBuffer()
    _add(buffer, 60)
    buffer.mark(calls.mark("after-60ms"))
    _add(buffer, 40)
    buffer.mark(calls.mark("after-100ms"))
    taken_before_due = []
    for tick in range(5):
        assert buffer.pop() is not None
        due, _ = buffer.take_markers()
        taken_before_due.extend((tick, m.marker) for m in due)
    assert taken_before_due == [(2, "after-60ms"), (4, "after-100ms")]


def test_marker_after_a_part_frame_waits_for_the_frame_that_completes_it() -> None:
    calls = Calls()
    buffer = PlayoutBuffer()
    buffer.add(response_id="r1", item_id="i1", content_index=0, pcm=pcm_ms(30))  # 1.5 frames
    buffer.mark(calls.mark("m"))
    assert buffer.pop() is not None
    assert not buffer.markers_due, "half a frame of its audio is still carried"
    buffer.finish_item(response_id="r1", item_id="i1", content_index=0)  # the tail is padded and queued
    assert buffer.pop() is not None
    assert [m.marker for m in buffer.take_markers()[0]] == ["m"]


def test_barge_in_clears_pending_markers_and_a_prompt_forgets_them() -> None:
    calls = Calls()
    buffer = PlayoutBuffer()
    _add(buffer, 100)
    buffer.mark(calls.mark("a"))
    buffer.interrupt()
    due, cleared = buffer.take_markers()
    assert due == [] and [m.marker for m in cleared] == ["a"]
    _add(buffer, 100, item="i2", response="r2")  # r1 was dropped by the barge-in
    buffer.mark(calls.mark("b"))
    assert not buffer.markers_due
    buffer.add_prompt(pcm_ms(20))
    buffer.clear()
    assert buffer.take_markers() == ([], [])
    buffer.mark(calls.mark("c"))  # positions start afresh after a clear
    assert [m.marker for m in buffer.take_markers()[0]] == ["c"]


async def test_session_calls_markers_back_in_the_tick_and_on_clear() -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=False))
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    calls = Calls()
    fake.emit(calls.mark("early"))  # nothing queued: answered at once
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(60)))
    fake.emit(AudioDone(response_id="r1", item_id="i1"))
    fake.emit(calls.mark("after-first"))
    fake.emit(ResponseStarted(response_id="r2"))
    fake.emit(AudioReceived(response_id="r2", item_id="i2", pcm=pcm_ms(200)))
    fake.emit(calls.mark("after-second"))
    await drained(session, fake)
    assert calls.calls == [("early", False)]
    for _ in range(3):
        assert session.pull_outbound() is not None
    assert calls.calls[-1] == ("after-first", False), "answered in the tick that took its last frame"
    assert session.pull_outbound() is not None
    fake.emit(ResponseInterrupted())  # the provider's own barge-in (a bot's clear)
    await wait_event(session, of_type(BargedIn, trigger="provider_interrupted"))
    assert calls.calls[-1] == ("after-second", True)
    assert session.pull_outbound() is None, "the playout is cut in the next tick"
    await session.aclose()


async def test_a_throwing_marker_callback_is_contained() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()

    def broken(marker: str, cleared: bool) -> None:
        raise RuntimeError("boom")

    model.last.emit(AudioMarked(marker="x", reached=broken))
    await drained(session, model.last)
    assert session.stats().errors == 1
    await session.aclose()


class KeypadFake(FakeRealtimeSession):
    async def send_dtmf(self, digit: str) -> None:
        await self._op("dtmf", digit)


class KeypadModel(FakeModel):
    async def connect(self, profile, *, history=(), resume_handle=None):  # type: ignore[no-untyped-def]
        session = KeypadFake(index=len(self.sessions), profile=profile, history=history, resume_handle=resume_handle)
        self.sessions.append(session)
        return session


async def test_dtmf_goes_to_a_keypad_session_as_a_keypress() -> None:
    model = KeypadModel()
    session, _ = make_session(model)
    await session.start()
    session.dtmf_received("5")
    await wait_event(session, of_type(DtmfReceived, digit="5"))
    sent = await model.last.wait_sent(lambda s: [e for e in s if e[0] == "dtmf"])
    assert sent == [("dtmf", "5")]
    kinds: set[Literal["text", "create_response"]] = {"text", "create_response"}
    assert not [e for e in model.last.sent if e[0] in kinds], "no text item and no response request"
    await session.aclose()
