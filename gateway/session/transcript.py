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


class Transcript:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: list[_Entry] = []
        self._speech: dict[tuple[str, str], _Entry] = {}
        self._calls: set[str] = set()
        self._outputs: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def placeholder(self, role: Literal["user", "assistant"], item_id: str) -> None:
        """Reserve the position of an item whose text arrives later (caller transcription lags the reply)."""
        if item_id and (role, item_id) not in self._speech:
            self._speech[(role, item_id)] = self._add(_Entry(kind="message", role=role, item_id=item_id, final=False))

    def speech(self, role: Literal["user", "assistant"], item_id: str, text: str, *, final: bool) -> None:
        """A transcript delta (``final`` False, appended) or the item's whole text (``final`` True, replaces)."""
        entry = self._speech.get((role, item_id)) if item_id else None
        if entry is None:
            entry = self._add(_Entry(kind="message", role=role, item_id=item_id, final=False))
            if item_id:
                self._speech[(role, item_id)] = entry
        entry.text = text if final else entry.text + text
        entry.final = final

    def message(self, role: Literal["user", "assistant", "system"], text: str) -> None:
        self._add(_Entry(kind="message", role=role, text=text))

    def function_call(self, call_id: str, name: str, arguments: str) -> None:
        if call_id not in self._calls:
            self._calls.add(call_id)
            self._add(_Entry(kind="function_call", call_id=call_id, name=name, arguments=arguments))

    def function_output(self, call_id: str, output: str) -> None:
        if call_id not in self._outputs:
            self._outputs.add(call_id)
            self._add(_Entry(kind="function_call_output", call_id=call_id, output=output))

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
