"""The pipeline's chat history: what the stateless chat model is sent with every request, per call.

Entries carry the item they came from (a caller turn ``user_N``, an assistant reply ``item_N``; "" for text the core
added), so a caller turn that goes on after a silent cancel replaces its first part, and a truncate replaces an
assistant reply with the words the caller heard (or removes it when none were). The call's transcript, replayed on
resume as :class:`~gateway.providers.base.HistoryItem` values, seeds it: function calls join the assistant message
before them and outputs become tool messages, the Chat Completions shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.providers.base import HistoryItem
from gateway.providers.pipeline.ports import ChatMessage, ChatToolCall


class ChatHistory:
    def __init__(self, history: Sequence[HistoryItem] = ()) -> None:
        self._entries: list[tuple[str, ChatMessage]] = history_messages(history)

    def append(self, message: ChatMessage, *, item_id: str = "") -> None:
        self._entries.append((item_id, message))

    def set(self, item_id: str, message: ChatMessage | None) -> None:
        """Replace the item's entry in place (appended when absent); None removes it."""
        index = next((i for i, (item, _m) in enumerate(self._entries) if item == item_id), None)
        if message is None:
            if index is not None:
                del self._entries[index]
        elif index is None:
            self._entries.append((item_id, message))
        else:
            self._entries[index] = (item_id, message)

    def drop(self, item_id: str) -> None:
        self._entries = [(i, m) for i, m in self._entries if i != item_id]

    def messages(self, *, system: str = "", instructions: str | None = None) -> list[ChatMessage]:
        """The request's messages: the profile's instructions, the history, then this reply's instructions."""
        out = [ChatMessage(role="system", content=system)] if system else []
        out += [message for _item, message in self._entries]
        if instructions:
            out.append(ChatMessage(role="system", content=instructions))
        return out


def history_messages(history: Sequence[HistoryItem]) -> list[tuple[str, ChatMessage]]:
    out: list[tuple[str, ChatMessage]] = []
    for item in history:
        if item.kind == "message":
            out.append(("", ChatMessage(role=item.role, content=item.text)))
        elif item.kind == "function_call":
            call = ChatToolCall(call_id=item.call_id, name=item.name, arguments=item.arguments or "{}")
            last = out[-1][1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = ("", ChatMessage(role="assistant", content=last.content, tool_calls=(*last.tool_calls, call)))
            else:
                out.append(("", ChatMessage(role="assistant", tool_calls=(call,))))
        else:
            out.append(("", ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output)))
    return out
