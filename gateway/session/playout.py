"""Agent audio playout: provider deltas cut into 20 ms frames per item, drained one frame per media tick.

Each provider audio item (response_id, item_id, content_index) is framed on its own: a partial frame is carried
across deltas of the same item and padded with silence only when the item ends, so every frame belongs to one
item and the session can say, to the sample, how much of each item the caller was actually sent (counted when a
frame is popped, i.e. when the tick sends it) against how much the provider delivered. Barge-in truncation points
are computed from those counts, never from wall-clock estimates.

An item's audio is either 24 kHz PCM16 (960 bytes a frame) or, from a provider in G.711 mode, the provider's
own 8 kHz G.711 codes (160 bytes a frame, padded with the law's silence code), kept as they came so a G.711
caller can be sent them unchanged. Accounting is in 24 kHz samples either way: one code is three samples, so a
whole frame of codes is 960 samples (20 ms), the same as a frame of PCM.

Markers (:class:`~gateway.providers.base.AudioMarked`) sit between deltas: a marker is due in the tick that takes
the last frame holding audio delivered before it (a part-frame still carried counts as the next frame), and
:meth:`PlayoutBuffer.take_markers` hands the due ones to the session, which calls them back. A barge-in hands the
pending ones over as cleared; emptying the playout for any other reason (a prompt, a connection going away)
forgets them.

Queued audio is kept as it came: one run per delta (its bytes, its item, how many whole frames it holds), and
a frame becomes an object only when the tick takes it. A queue of one object per 20 ms frame would be walked by
every collector pass it outlives: at 400 calls those frames were half of what the middle passes walked
(docs/performance/2026-12-03-playout-runs.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import final

import numpy as np

from gateway.providers.base import AudioMarked
from gateway.session.events import InterruptedItem
from telcodecs.frames import FRAME_BYTES, FRAME_SAMPLES, G711_FRAME_BYTES, SAMPLE_RATE, G711Law, Pcm
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE

_SAMPLES_PER_MS = SAMPLE_RATE // 1000
_SAMPLES_PER_CODE = FRAME_SAMPLES // G711_FRAME_BYTES  # 3: one 8 kHz code spans three 24 kHz samples
_SILENCE_CODE = {"pcmu": bytes([ULAW_SILENCE]), "pcma": bytes([ALAW_SILENCE])}
_DROPPED_MEMORY = 64  # responses remembered as dropped; late deltas arrive within one response, never far behind


@dataclass(slots=True, kw_only=True, eq=False)
class ItemAudio:
    """Accounting of one provider audio item; ``law`` is None for PCM16, else the law of its G.711 codes."""

    response_id: str
    item_id: str
    content_index: int
    law: G711Law | None = None
    received_bytes: int = 0
    sent_samples: int = 0
    queued_frames: int = 0
    done: bool = False
    carry: bytes = b""
    received_at: float | None = None  # the session clock when its first audio arrived
    played_at: float | None = None  # ... and when its first frame was taken for the caller

    @property
    def received_samples(self) -> int:
        """Delivered audio in 24 kHz samples (a G.711 code is three)."""
        return self.received_bytes // 2 if self.law is None else self.received_bytes * _SAMPLES_PER_CODE

    @property
    def received_ms(self) -> int:
        return self.received_samples // _SAMPLES_PER_MS

    @property
    def sent_ms(self) -> int:
        return self.sent_samples // _SAMPLES_PER_MS


_Key = tuple[str, str, int]


@final
class G711Codes:
    """One frame of a provider's G.711 audio: 160 codes of ``law``, as the provider sent them. A plain class,
    read-only by convention: one is built per frame of G.711 agent audio (gateway/media/rtp.py says why)."""

    __slots__ = ("codes", "law")

    def __init__(self, codes: bytes, law: G711Law) -> None:
        self.codes = codes
        self.law = law

    def __repr__(self) -> str:
        return f"G711Codes({len(self.codes)} codes, law={self.law!r})"


#: One frame's audio: 480 samples of PCM16, or 160 G.711 codes.
FrameAudio = Pcm | G711Codes


@dataclass(slots=True, eq=False)
class _Run:
    """Whole frames of one item queued as one buffer: ``frames`` of them from the start of ``data``, ``taken``
    already sent; the last one holds ``last_samples`` of real audio (fewer than a frame when it was padded)."""

    data: bytes
    item: ItemAudio
    frames: int
    last_samples: int = FRAME_SAMPLES
    taken: int = 0


class PlayoutBuffer:
    """Frames waiting to be sent to the caller, with per-item sent/received accounting."""

    def __init__(self) -> None:
        self._runs: deque[_Run] = deque()
        self._queued = 0  # whole frames in _runs not yet taken
        self._items: dict[_Key, ItemAudio] = {}
        self._last: ItemAudio | None = None
        self._dropped: deque[str] = deque(maxlen=_DROPPED_MEMORY)
        self._appended = 0  # frames ever queued (since the last clear), the position markers are placed at
        self._taken = 0  # ... and frames taken by the tick
        self._markers: deque[tuple[int, AudioMarked]] = deque()  # (position, marker), positions non-decreasing
        self._due: list[AudioMarked] = []  # reached, not yet taken by the session
        self._cleared: list[AudioMarked] = []  # dropped by a barge-in, not yet taken by the session

    @property
    def playing(self) -> bool:
        """True while frames are queued (or a partial frame waits for more of its item)."""
        return self._queued > 0 or (self._last is not None and bool(self._last.carry))

    @property
    def starved(self) -> bool:
        """Nothing queued while an item's audio is still arriving: the caller hears a gap in the agent's speech."""
        return self._queued == 0 and any(not item.done for item in self._items.values())

    @property
    def queued_frames(self) -> int:
        return self._queued

    @property
    def markers_due(self) -> bool:
        """Markers reached or cleared wait for :meth:`take_markers`."""
        return bool(self._due or self._cleared)

    def mark(self, marker: AudioMarked) -> None:
        """Place ``marker`` after all audio queued so far; due at once when nothing is queued or carried."""
        last = self._last
        position = self._appended + (1 if last is not None and last.carry else 0)
        if position <= self._taken:
            self._due.append(marker)
        else:
            self._markers.append((position, marker))

    def take_markers(self) -> tuple[list[AudioMarked], list[AudioMarked]]:
        """The markers reached (audio sent) and cleared (audio dropped by a barge-in) since the last call."""
        due, cleared = self._due, self._cleared
        self._due, self._cleared = [], []
        return due, cleared

    def has_item(self, item_id: str) -> bool:
        """Audio of ``item_id`` is queued or still arriving."""
        return any(item.item_id == item_id for item in self._items.values())

    def is_dropped(self, response_id: str) -> bool:
        return response_id in self._dropped

    def item(self, item_id: str, *, content_index: int = 0, response_id: str = "") -> ItemAudio | None:
        """The accounting of an item not yet fully played (fully played items are forgotten)."""
        return self._items.get((response_id, item_id, content_index))

    def add(
        self,
        *,
        response_id: str,
        item_id: str,
        content_index: int,
        pcm: bytes,
        law: G711Law | None = None,
        at: float | None = None,
    ) -> bool:
        """Queue a delta: PCM16 bytes, or G.711 codes of ``law``. False when the response was dropped by barge-in
        (the delta is discarded). An item keeps the kind of its first delta (one connection, one audio format);
        ``at``, the clock when the delta arrived, is kept as the item's ``received_at`` from its first delta."""
        if response_id in self._dropped:
            return False
        key = (response_id, item_id, content_index)
        item = self._items.get(key)
        if item is None:
            item = ItemAudio(
                response_id=response_id, item_id=item_id, content_index=content_index, law=law, received_at=at
            )
            self._items[key] = item
        previous = self._last
        if previous is not None and previous is not item:
            # A new item starts: the previous one is complete (items stream one after another); its tail plays
            # first, padded to a whole frame.
            previous.done = True
            self._flush_carry(previous)
            self._forget_if_played(previous)
        self._last = item
        item.received_bytes += len(pcm)
        data = item.carry + pcm if item.carry else pcm
        size = FRAME_BYTES if item.law is None else G711_FRAME_BYTES
        whole = len(data) // size
        if whole:
            self._runs.append(_Run(data, item, whole))
            self._queued += whole
            self._appended += whole
        item.carry = data[whole * size :]
        item.queued_frames += whole
        return True

    def finish_item(self, *, response_id: str, item_id: str, content_index: int = 0) -> None:
        """The item's audio is complete: its partial tail is padded and queued."""
        item = self._items.get((response_id, item_id, content_index))
        if item is None:
            return
        item.done = True
        self._flush_carry(item)
        self._forget_if_played(item)

    def finish_audio(self, *, response_id: str, item_id: str) -> None:
        """AudioDone names no content part: finish every part of the item."""
        for item in [i for i in self._items.values() if i.response_id == response_id and i.item_id == item_id]:
            self.finish_item(response_id=response_id, item_id=item_id, content_index=item.content_index)

    def finish_response(self, response_id: str) -> None:
        for item in [i for i in self._items.values() if i.response_id == response_id and not i.done]:
            self.finish_item(response_id=response_id, item_id=item.item_id, content_index=item.content_index)

    def pop(self) -> tuple[FrameAudio, ItemAudio] | None:
        """The next frame to send (PCM or G.711 codes) and its item; counts the frame's real samples as sent."""
        runs = self._runs
        if not runs:
            return None
        run = runs[0]
        item = run.item
        index = run.taken
        audio: FrameAudio
        if item.law is None:
            audio = np.frombuffer(run.data, dtype="<i2", count=FRAME_SAMPLES, offset=index * FRAME_BYTES)
        else:
            start = index * G711_FRAME_BYTES
            audio = G711Codes(run.data[start : start + G711_FRAME_BYTES], item.law)
        run.taken = index + 1
        if run.taken == run.frames:
            runs.popleft()
            item.sent_samples += run.last_samples
        else:
            item.sent_samples += FRAME_SAMPLES
        self._queued -= 1
        item.queued_frames -= 1
        self._forget_if_played(item)
        self._taken += 1
        markers = self._markers
        while markers and markers[0][0] <= self._taken:
            self._due.append(markers.popleft()[1])
        return audio, item

    def interrupt(self, *, also_drop: str | None = None) -> list[InterruptedItem]:
        """Barge-in: drop every queued frame and report each item the caller did not hear to its end.

        The responses of those items (and ``also_drop``) are marked dropped: their later deltas are discarded.
        """
        interrupted = [
            InterruptedItem(
                response_id=item.response_id,
                item_id=item.item_id,
                content_index=item.content_index,
                sent_ms=item.sent_ms,
                received_ms=item.received_ms,
            )
            for item in self._items.values()
            if not (item.done and item.queued_frames == 0 and item.sent_samples >= item.received_samples)
        ]
        for response_id in {i.response_id for i in interrupted} | ({also_drop} if also_drop else set()):
            self.drop_response(response_id)
        self._cleared.extend(marker for _, marker in self._markers)
        self._markers.clear()
        self.clear()
        return interrupted

    def drop_response(self, response_id: str) -> None:
        if response_id not in self._dropped:
            self._dropped.append(response_id)

    def clear(self) -> None:
        """Empty the playout; pending markers are forgotten (see the module docstring)."""
        self._runs.clear()
        self._queued = 0
        self._items.clear()
        self._last = None
        self._markers.clear()
        self._appended = self._taken = 0

    def add_prompt(self, pcm: bytes) -> None:
        """Queue local audio (an apology prompt) outside any provider item."""
        self.add(response_id="", item_id="", content_index=-1, pcm=pcm)
        self.finish_item(response_id="", item_id="", content_index=-1)

    def _flush_carry(self, item: ItemAudio) -> None:
        if not item.carry:
            return
        carry = item.carry
        if item.law is None:
            padded = carry + bytes(FRAME_BYTES - len(carry))
            samples = len(carry) // 2
        else:
            padded = carry + _SILENCE_CODE[item.law] * (G711_FRAME_BYTES - len(carry))
            samples = len(carry) * _SAMPLES_PER_CODE
        self._runs.append(_Run(padded, item, 1, samples))
        self._queued += 1
        self._appended += 1
        item.queued_frames += 1
        item.carry = b""

    def _forget_if_played(self, item: ItemAudio) -> None:
        if item.done and item.queued_frames == 0 and not item.carry:
            self._items.pop((item.response_id, item.item_id, item.content_index), None)
            if self._last is item:
                self._last = None


def comfort_tone_frame(*, level_dbfs: float = -36.0, frequency_hz: float = 400.0) -> Pcm:
    """One 20 ms frame of a soft sine; 400 Hz fits 8 whole cycles into a frame so frames join seamlessly."""
    t = np.arange(FRAME_SAMPLES) / SAMPLE_RATE
    amplitude = 32768.0 * 10 ** (level_dbfs / 20) * np.sqrt(2)
    tone: Pcm = np.round(amplitude * np.sin(2 * np.pi * frequency_hz * t)).astype(np.int16)
    tone.flags.writeable = False
    return tone
