"""The call's own transcript: what was said and which tools ran, in conversation order.

It is the source of the context replayed into a fresh provider session on resume (as HistoryItems), so a
function output enters it only once it reached a provider: replaying it and then delivering it again would
give the model the same result twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.providers.base import HistoryItem


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptEntry:
    kind: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] = "user"
    text: str = ""
    item_id: str = ""
    final: bool = True
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    at: float = 0.0
    ended_at: float | None = None  # a message: when its speech ended (the agent's: played out, or cut)
    truncated: bool = False  # the agent's message was cut by a barge-in: the caller heard only part of it


@dataclass(slots=True, kw_only=True)
class _Entry:
    kind: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] = "user"
    text: str = ""
    item_id: str = ""
    final: bool = True
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    at: float = 0.0
    ended_at: float | None = None  # a message: when its speech ended (the agent's: played out, or cut)
    truncated: bool = False  # the agent's message was cut by a barge-in: the caller heard only part of it


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfEntry:
    digit: str
    direction: Literal["received", "sent"]
    at: float
    method: DtmfMethod | None = None  # how a sent digit went out (None: received)


DtmfMethod = Literal["rfc4733", "info", "inband", "webrtc"]


DTMF_LOG_MAX = 256  # digits kept per call (a keypad left pressed cannot grow it without bound)


class Transcript:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: list[_Entry] = []
        self._speech: dict[tuple[str, str], _Entry] = {}
        self._calls: set[str] = set()
        self._outputs: set[str] = set()
        self._open: list[_Entry] = []  # speech items whose end is not known yet
        self._dtmf: list[DtmfEntry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def placeholder(self, role: Literal["user", "assistant"], item_id: str) -> None:
        """Reserve the position of an item whose text arrives later (caller transcription lags the reply)."""
        if item_id and (role, item_id) not in self._speech:
            entry = self._add(_Entry(kind="message", role=role, item_id=item_id, final=False))
            self._speech[(role, item_id)] = entry
            self._open.append(entry)

    def ended(self, role: Literal["user", "assistant"], item_id: str = "") -> None:
        """Speech ended now: the item ``item_id`` of ``role``, or (no id) every open item of ``role``."""
        now = self._clock()
        for entry in [e for e in self._open if e.role == role and (not item_id or e.item_id == item_id)]:
            entry.ended_at = now
            self._open.remove(entry)

    def truncated(self, item_ids: tuple[str, ...]) -> None:
        """A barge-in cut these agent items now (the text stays as the provider gave it)."""
        now = self._clock()
        for item_id in item_ids:
            entry = self._speech.get(("assistant", item_id))
            if entry is not None:
                entry.truncated = True
                entry.ended_at = now
                if entry in self._open:
                    self._open.remove(entry)

    def speech(self, role: Literal["user", "assistant"], item_id: str, text: str, *, final: bool) -> None:
        """A transcript delta (``final`` False, appended) or the item's whole text (``final`` True, replaces)."""
        entry = self._speech.get((role, item_id)) if item_id else None
        if entry is None:
            entry = self._add(_Entry(kind="message", role=role, item_id=item_id, final=False))
            if item_id:
                self._speech[(role, item_id)] = entry
            if entry.role == "assistant" or item_id:
                self._open.append(entry)
        entry.text = text if final else entry.text + text
        entry.final = final

    def message(self, role: Literal["user", "assistant", "system"], text: str) -> None:
        """A whole message at once (a keypress, an injected text): it begins and ends now."""
        entry = self._add(_Entry(kind="message", role=role, text=text))
        entry.ended_at = entry.at

    def function_call(self, call_id: str, name: str, arguments: str) -> None:
        if call_id not in self._calls:
            self._calls.add(call_id)
            self._add(_Entry(kind="function_call", call_id=call_id, name=name, arguments=arguments))

    def function_output(self, call_id: str, output: str) -> None:
        if call_id not in self._outputs:
            self._outputs.add(call_id)
            self._add(_Entry(kind="function_call_output", call_id=call_id, output=output))

    def dtmf(self, digits: str, direction: Literal["received", "sent"], *, method: DtmfMethod | None = None) -> None:
        now = self._clock()
        room = DTMF_LOG_MAX - len(self._dtmf)
        self._dtmf.extend(
            DtmfEntry(digit=digit, direction=direction, at=now, method=method) for digit in digits[: max(0, room)]
        )

    def dtmf_log(self) -> tuple[DtmfEntry, ...]:
        return tuple(self._dtmf)

    def entries(self) -> tuple[TranscriptEntry, ...]:
        return tuple(
            TranscriptEntry(
                kind=e.kind,
                role=e.role,
                text=e.text,
                item_id=e.item_id,
                final=e.final,
                call_id=e.call_id,
                name=e.name,
                arguments=e.arguments,
                output=e.output,
                at=e.at,
                ended_at=e.ended_at,
                truncated=e.truncated,
            )
            for e in self._entries
        )

    def history(self, *, resume_instruction: str = "") -> tuple[HistoryItem, ...]:
        """The transcript as provider history, plus a closing system item (e.g. "do not greet again")."""
        items: list[HistoryItem] = []
        for e in self._entries:
            if e.kind == "message":
                if e.text.strip():
                    items.append(HistoryItem(kind="message", role=e.role, text=e.text))
            elif e.kind == "function_call":
                items.append(HistoryItem(kind="function_call", call_id=e.call_id, name=e.name, arguments=e.arguments))
            else:
                items.append(HistoryItem(kind="function_call_output", call_id=e.call_id, output=e.output))
        if resume_instruction:
            items.append(HistoryItem(kind="message", role="system", text=resume_instruction))
        return tuple(items)

    def _add(self, entry: _Entry) -> _Entry:
        entry.at = self._clock()
        self._entries.append(entry)
        return entry
