"""The no-keys chat model: a deterministic rule agent that answers through the same events as a real LLM.

It reads the last message of the history and answers, in this order of rules:

================================  ==========================================================================
the last message                  the answer
================================  ==========================================================================
a tool result                     a short acknowledgement (or an apology when the output carries "error")
none from the caller yet          the greeting
says goodbye ("bye", "that's      "Goodbye, thank you for calling." then the end-call tool (``hang_up``) when
all", "hang up")                  the session offers it
asks for a person ("human",       "Let me transfer you to a person." then the transfer tool (``transfer``)
"agent", "operator", ...)         with ``transfer_target`` (or the tool's first allowed target)
holds digits (spoken or written)  reads them back one by one: "I heard four, five, seven, two."
anything else                     "You said: <the caller's words>."
================================  ==========================================================================

Tool calls are real :class:`~gateway.providers.pipeline.ports.ToolCallDone` events with JSON arguments, so the
session core runs its own built-in tools (gateway/session/tools.py) exactly as it would for a cloud model.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.providers.base import ToolSpec
from gateway.providers.pipeline.ports import (
    ChatMessage,
    ChatToolCall,
    LlmEvent,
    LlmFinished,
    TextDelta,
    ToolCallDone,
)

END_CALL_TOOL: Final = "hang_up"  # gateway.session.tools.HangUpTool
TRANSFER_TOOL: Final = "transfer"  # gateway.session.tools.TransferTool

_GOODBYE = re.compile(r"\b(good ?bye|bye|farewell|that'?s all|hang up|end the call)\b")
_PERSON = re.compile(r"\b(human|person|agent|operator|representative|somebody real|someone real)\b")
_DIGIT_WORDS: Final = {
    "zero": "0",
    "oh": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
_SPOKEN: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleAgentConfig:
    greeting: str = "Hello, how can I help you?"
    goodbye: str = "Goodbye, thank you for calling."
    transfer_text: str = "Let me transfer you to a person."
    transfer_target: str = ""  # empty: the transfer tool's first allowed target, else "operator"


def digits_in(text: str) -> list[str]:
    """The digits a caller said, in order: written ("4572") or spoken ("four five seven two"); "oh" counts as
    zero only between other digits."""
    tokens = re.findall(r"\d|[a-z]+", text.lower())
    found: list[str] = []
    for i, token in enumerate(tokens):
        if token.isdigit():
            found.append(token)
        elif token in _DIGIT_WORDS:
            if token == "oh" and not (_is_digit(tokens, i - 1) and _is_digit(tokens, i + 1)):
                continue
            found.append(_DIGIT_WORDS[token])
    return found


def _is_digit(tokens: list[str], i: int) -> bool:
    return 0 <= i < len(tokens) and (tokens[i].isdigit() or (tokens[i] in _DIGIT_WORDS and tokens[i] != "oh"))


class RuleAgent:
    """A :class:`~gateway.providers.pipeline.ports.ChatModel` with no model behind it."""

    def __init__(self, config: RuleAgentConfig | None = None) -> None:
        self.config = config or RuleAgentConfig()
        self._call_ids = itertools.count(1)

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str = ""
    ) -> AsyncIterator[LlmEvent]:
        offered = {tool.name: tool for tool in tools}
        text, call = self._answer(messages, offered)
        if text:
            yield TextDelta(text=text)
        if call is not None:
            yield ToolCallDone(call=call)
            yield LlmFinished(finish_reason="tool_calls")
            return
        yield LlmFinished(finish_reason="stop")

    def _answer(self, messages: Sequence[ChatMessage], tools: dict[str, ToolSpec]) -> tuple[str, ChatToolCall | None]:
        last = next((m for m in reversed(messages) if m.role in ("user", "tool")), None)
        if last is None:
            return self.config.greeting, None
        if last.role == "tool":
            failed = "error" in last.content.lower()
            return ("Sorry, that did not work." if failed else "Done."), None
        said = " ".join(last.content.split())
        lowered = said.lower()
        if _GOODBYE.search(lowered):
            return self.config.goodbye, self._call(tools, END_CALL_TOOL, {"reason": "the caller said goodbye"})
        if _PERSON.search(lowered):
            target = self._transfer_target(tools.get(TRANSFER_TOOL))
            return self.config.transfer_text, self._call(tools, TRANSFER_TOOL, {"target": target})
        digits = digits_in(said)
        if digits:
            return f"I heard {', '.join(_SPOKEN[int(d)] for d in digits)}.", None
        if not said:
            return "Sorry, I did not catch that.", None
        return f"You said: {said.rstrip('.!?')}.", None

    def _call(self, tools: dict[str, ToolSpec], name: str, arguments: dict[str, str]) -> ChatToolCall | None:
        if name not in tools:
            return None
        return ChatToolCall(call_id=f"rule_{next(self._call_ids)}", name=name, arguments=json.dumps(arguments))

    def _transfer_target(self, spec: ToolSpec | None) -> str:
        if self.config.transfer_target:
            return self.config.transfer_target
        if spec is not None:
            target = spec.parameters.get("properties", {}).get("target", {})
            allowed = target.get("enum") if isinstance(target, dict) else None
            if isinstance(allowed, list) and allowed:
                return str(allowed[0])
        return "operator"

    async def aclose(self) -> None:
        return None
