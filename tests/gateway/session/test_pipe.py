"""ProviderPipe: caller frames reach the provider exactly once and in order, from the tick or the sender task."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest

from gateway.providers.errors import ProviderClosedError
from gateway.session.pipe import Link, ProviderPipe, frame_is_quiet
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import alaw_encode, ulaw_encode

pytestmark = pytest.mark.timeout(30)


def frame(i: int) -> Frame:
    pcm = np.full(FRAME_SAMPLES, i, dtype=np.int16)
    pcm.flags.writeable = False
    return Frame(index=i, pcm=pcm)


def indexes(pcm: bytes) -> list[int]:
    """The frame indexes a batch carries (every sample of frame i is i)."""
    samples = np.frombuffer(pcm, dtype="<i2")
    return [int(samples[k]) for k in range(0, samples.size, FRAME_SAMPLES)]


class ScriptedSession:
    """Answers send_audio_nowait from a script (True, False or an exception; True once it runs out)."""

    def __init__(self, script: list[bool | BaseException] | None = None) -> None:
        self.script = list(script or [])
        self.sent: list[tuple[str, list[int]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.awaiting = asyncio.Event()
        self.changed = asyncio.Event()  # set on every send that reached the session

    def send_audio_nowait(self, pcm: bytes) -> bool:
        outcome = self.script.pop(0) if self.script else True
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome:
            self.sent.append(("nowait", indexes(pcm)))
            self.changed.set()
        return outcome

    async def send_audio(self, pcm: bytes) -> None:
        self.awaiting.set()
        await self.gate.wait()
        self.sent.append(("await", indexes(pcm)))
        self.changed.set()

    def order(self) -> list[int]:
        return [i for _, batch in self.sent for i in batch]


def spoken(i: int, peak: int) -> Frame:
    """Frame ``i`` (its first sample) at ``peak``: quiet under 512 (-36 dBFS), speech from there."""
    pcm = np.full(FRAME_SAMPLES, peak, dtype=np.int16)
    pcm[0] = i
    pcm.flags.writeable = False
    return Frame(index=i, pcm=pcm)


def make_pipe(
    *, chunk: int = 1, max_batch: int = 10, hold: int = 100, quiet_chunk: int | None = None, quiet_after: int = 50
) -> tuple[ProviderPipe, list[Any]]:
    failures: list[Any] = []
    pipe = ProviderPipe(
        hold_frames=hold,
        chunk_frames=chunk,
        max_batch_frames=max_batch,
        can_send=lambda: True,
        on_send_failed=lambda link, exc: failures.append((link.epoch, exc)),
        quiet_chunk_frames=quiet_chunk,
        quiet_after_frames=quiet_after,
    )
    return pipe, failures


def install(pipe: ProviderPipe, session: ScriptedSession) -> Link:
    link, _ = pipe.install(session, now=0.0)  # type: ignore[arg-type]
    return link


async def sent_frames(session: ScriptedSession, count: int, timeout_s: float = 5.0) -> None:
    """Wait (bounded) until ``count`` frames reached the session; the sending task has finished its step."""
    async with asyncio.timeout(timeout_s):
        while len(session.order()) < count:
            session.changed.clear()
            await session.changed.wait()


def test_complete_chunks_are_written_from_push_without_a_task() -> None:
    pipe, failures = make_pipe(chunk=3)
    session = ScriptedSession()
    install(pipe, session)
    for i in range(7):
        pipe.push(frame(i), holding=False)
    assert session.sent == [("nowait", [0, 1, 2]), ("nowait", [3, 4, 5])]
    assert pipe.queued_frames == 1  # frame 6 waits for its chunk
    assert (pipe.frames_sent, pipe.audio_sends, failures) == (6, 2, [])


async def test_a_chunk_the_connection_cannot_take_goes_to_the_sender_without_being_overtaken() -> None:
    pipe, _ = make_pipe()
    session = ScriptedSession([True, True, False])
    session.gate.clear()
    install(pipe, session)
    sender = asyncio.create_task(pipe.sender_loop())
    try:
        for i in range(3):
            pipe.push(frame(i), holding=False)
        await asyncio.wait_for(session.awaiting.wait(), 5)  # the sender is writing frame 2
        for i in range(3, 6):
            pipe.push(frame(i), holding=False)  # must queue behind it, not jump ahead through nowait
        assert session.sent == [("nowait", [0]), ("nowait", [1])]
        session.gate.set()
        await sent_frames(session, 6)
        assert pipe.frames_sent == 6
        assert session.sent[2] == ("await", [2])
        assert session.order() == list(range(6))
        pipe.push(frame(6), holding=False)  # the sender is idle again: back to the tick's path
        assert session.sent[-1] == ("nowait", [6])
    finally:
        sender.cancel()


async def test_an_encoded_chunk_is_encoded_once_even_when_the_sender_writes_it() -> None:
    pipe, _ = make_pipe()
    encoded: list[int] = []

    def encode(batch: list[Frame]) -> bytes:
        encoded.extend(f.index for f in batch)
        return b"".join(f.to_bytes() for f in batch)

    pipe.encode = encode
    session = ScriptedSession([False])
    install(pipe, session)
    sender = asyncio.create_task(pipe.sender_loop())
    try:
        pipe.push(frame(0), holding=False)
        await sent_frames(session, 1)
        assert encoded == [0] and session.sent == [("await", [0])]
    finally:
        sender.cancel()


def test_a_failed_write_puts_the_chunk_back_and_reports_the_link() -> None:
    pipe, failures = make_pipe()
    session = ScriptedSession([ProviderClosedError("gone", retryable=True)])
    link = install(pipe, session)
    pipe.push(frame(0), holding=False)
    assert pipe.queued_frames == 1 and pipe.frames_sent == 0
    assert len(failures) == 1 and failures[0][0] == link.epoch
    assert isinstance(failures[0][1], ProviderClosedError)


async def test_held_frames_are_sent_first_once_the_session_may_send() -> None:
    pipe, _ = make_pipe(max_batch=4)
    session = ScriptedSession()
    for i in range(6):
        pipe.push(frame(i), holding=True)
    assert session.sent == [] and pipe.frames_held == 6
    install(pipe, session)
    sender = asyncio.create_task(pipe.sender_loop())
    try:
        pipe.wake()
        await sent_frames(session, 6)
        pipe.push(frame(6), holding=False)
        assert session.order() == list(range(7))
        assert [kind for kind, _ in session.sent][:2] == ["await", "await"]  # batches of up to 4 held frames
    finally:
        sender.cancel()


@pytest.mark.parametrize("seed", range(20))
async def test_every_frame_arrives_once_in_order_whatever_the_connection_takes(seed: int) -> None:
    rng = random.Random(seed)
    chunk = rng.choice([1, 2, 5])
    pipe, failures = make_pipe(chunk=chunk, max_batch=10)
    session = ScriptedSession([rng.random() < 0.7 for _ in range(200)])
    install(pipe, session)
    sender = asyncio.create_task(pipe.sender_loop())
    try:
        total = 100 - 100 % chunk
        for i in range(total):
            pipe.push(frame(i), holding=False)
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # let the sender task run now and then, as the tick does
        await sent_frames(session, total)
        assert pipe.frames_sent == total
        assert session.order() == list(range(total))
        assert all(len(batch) % chunk == 0 for _, batch in session.sent)
        assert failures == [] and pipe.frames_dropped == 0
    finally:
        sender.cancel()


def test_a_quiet_caller_goes_in_larger_chunks_and_speech_goes_at_once() -> None:
    pipe, failures = make_pipe(chunk=1, quiet_chunk=5, quiet_after=3)
    session = ScriptedSession()
    install(pipe, session)
    for i in range(3):
        pipe.push(spoken(i, 3000), holding=False)
    for i in range(3, 10):  # quiet: the third quiet frame (5) starts the larger chunks
        pipe.push(spoken(i, 100), holding=False)
    assert [batch for _, batch in session.sent] == [[0], [1], [2], [3], [4], [5, 6, 7, 8, 9]]
    pipe.push(spoken(10, 0), holding=False)
    pipe.push(spoken(11, 0), holding=False)
    assert pipe.queued_frames == 2  # quiet frames wait for their chunk
    pipe.push(spoken(12, -600), holding=False)  # speech (a negative peak counts too): all that waited, now
    assert session.sent[-1] == ("nowait", [10, 11, 12]) and pipe.queued_frames == 0
    pipe.push(spoken(13, 0), holding=False)  # one quiet frame after speech is not a quiet caller yet
    assert session.sent[-1] == ("nowait", [13])
    assert (pipe.frames_sent, failures) == (14, [])


def test_quiet_chunks_are_off_unless_larger_than_the_chunk() -> None:
    pipe, _ = make_pipe(chunk=2, quiet_chunk=2, quiet_after=1)
    session = ScriptedSession()
    install(pipe, session)
    for i in range(6):
        pipe.push(spoken(i, 0), holding=False)
    assert [batch for _, batch in session.sent] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize(("peak", "quiet"), [(0, True), (511, True), (-511, True), (512, False), (-512, False)])
def test_a_frame_is_quiet_below_minus_36_dbfs(peak: int, quiet: bool) -> None:
    pcm = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    pcm[77] = peak
    assert frame_is_quiet(Frame(index=0, pcm=pcm)) is quiet


@pytest.mark.parametrize(("law", "encode"), [("pcmu", ulaw_encode), ("pcma", alaw_encode)])
def test_a_g711_frame_is_judged_by_the_callers_own_codes(law: str, encode: Any) -> None:
    pcm8 = np.zeros(160, dtype=np.int16)
    silent = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    assert frame_is_quiet(Frame(index=0, pcm=silent, g711=encode(pcm8), g711_law=law))
    pcm8[40] = 4000  # one loud code; the PCM beside it says silence, the codes are what the caller sent
    assert not frame_is_quiet(Frame(index=0, pcm=silent, g711=encode(pcm8), g711_law=law))
