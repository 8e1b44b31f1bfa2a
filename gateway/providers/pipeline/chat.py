"""An OpenAI-compatible Chat Completions client, streamed: OpenAI, Groq, vLLM, Ollama, llama-server.

Protocol (the ``openai`` SDK's ``CompletionCreateParamsStreaming`` and ``ChatCompletionChunk``; PIPELINE.md §2.2):
``POST {base}/chat/completions`` with ``stream: true``; the answer is ``text/event-stream`` whose events are
``data: <chunk JSON>`` and end with ``data: [DONE]``. Text arrives as ``choices[0].delta.content``; a tool call's
first delta carries ``index``, ``id``, ``type`` and ``function.name``, later ones only ``index`` and
``function.arguments`` fragments.

Sans-I/O pieces, fed bytes and dicts, tested on their own:

* :func:`chat_request` builds the request body from the pipeline's :class:`ChatMessage` history.
* :class:`SseDecoder` turns a byte stream (cut anywhere) into the ``data`` payloads of its events.
* :class:`ChunkAccumulator` turns chunks into :class:`~.ports.LlmEvent` values. Tool calls are keyed by
  ``(index, id)`` (some proxies send parallel calls with one index), and their arguments must be complete JSON
  when the stream finishes, or the call is reported as a failure instead of being run with half its arguments.

:class:`OpenAICompatibleChat` is the thin shell over ``httpx``. Cancelling the consuming task closes the HTTP
response, which is how the server learns the caller barged in.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from gateway.providers.base import ToolSpec
from gateway.providers.pipeline.ports import (
    ChatMessage,
    ChatToolCall,
    LlmEvent,
    LlmFailed,
    LlmFinished,
    TextDelta,
    ToolCallDone,
)

DONE = "[DONE]"
# HTTP statuses after which a second attempt may succeed: rate limits and server trouble.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatConfig:
    """Where the chat model is. ``url`` is the API base (``https://api.openai.com/v1``, ``http://host:8000/v1``)."""

    url: str
    model: str
    api_key: str = field(default="", repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    connect_timeout_s: float = 5.0
    # Longest silence between two streamed bytes before the request counts as failed.
    read_timeout_s: float = 30.0
    extra_headers: Mapping[str, str] = field(default_factory=dict)


def chat_request(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    model: str,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed Chat Completions request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [message_param(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
            }
            for t in tools
        ]
        body["tool_choice"] = "auto"
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def message_param(message: ChatMessage) -> dict[str, Any]:
    """One history entry in the wire shape (``ChatCompletionMessageParam``)."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        out: dict[str, Any] = {
            "role": "assistant",
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in message.tool_calls
            ],
        }
        if message.content:
            out["content"] = message.content
        return out
    return {"role": message.role, "content": message.content}


class SseDecoder:
    """Server-sent events (WHATWG HTML §9.2) -> the ``data`` of each event, fed bytes cut anywhere.

    Lines end in LF, CR or CRLF; ``data:`` lines of one event are joined with LF; comments (``:``) and other
    fields (``event``, ``id``, ``retry``) are ignored: Chat Completions uses only ``data``.
    """

    def __init__(self, *, max_event_bytes: int = 1 << 20) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._pending_cr = False
        self._max = max_event_bytes

    def feed(self, data: bytes) -> list[str]:
        if self._pending_cr and data.startswith(b"\n"):
            data = data[1:]  # the LF of a CRLF split across two reads
        self._pending_cr = data.endswith(b"\r")
        buffer = self._buffer + data
        events: list[str] = []
        start = 0
        while True:
            cr, lf = buffer.find(b"\r", start), buffer.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or (0 <= lf < cr) else cr
            line = buffer[start:end]
            step = 2 if buffer[end : end + 2] == b"\r\n" else 1
            start = end + step
            self._line(line.decode("utf-8", errors="replace"), events)
        self._buffer = buffer[start:]
        if len(self._buffer) > self._max:
            raise ValueError(f"server-sent event line longer than {self._max} bytes")
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)


@dataclass(slots=True)
class _PartialCall:
    index: int
    call_id: str
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChunkAccumulator:
    """``ChatCompletionChunk`` dicts -> :class:`LlmEvent` values; the last is LlmFinished or LlmFailed."""

    def __init__(self) -> None:
        self._calls: list[_PartialCall] = []
        self._finish = ""
        self.finished = False

    def feed(self, chunk: Mapping[str, Any]) -> list[LlmEvent]:
        if self.finished:
            return []
        if "error" in chunk:  # OpenAI-compatible servers report mid-stream failures this way
            error = chunk.get("error") or {}
            message = error.get("message") if isinstance(error, Mapping) else str(error)
            self.finished = True
            return [LlmFailed(message=f"server error in stream: {message}", retryable=True)]
        events: list[LlmEvent] = []
        for choice in chunk.get("choices") or ():
            if int(choice.get("index", 0)) != 0:
                continue  # n > 1 is never requested
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                events.append(TextDelta(text=str(content)))
            for piece in delta.get("tool_calls") or ():
                self._tool_delta(piece)
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        return events

    def end(self) -> list[LlmEvent]:
        """The stream ended (``[DONE]`` or EOF): the tool calls, then LlmFinished, or LlmFailed."""
        if self.finished:
            return []
        self.finished = True
        if not self._finish:
            return [LlmFailed(message="the stream ended without a finish_reason", retryable=True)]
        events: list[LlmEvent] = []
        for call in self._calls:
            arguments = "".join(call.arguments) or "{}"
            if not call.name:
                return [LlmFailed(message=f"tool call {call.call_id or call.index} has no name", retryable=True)]
            try:
                parsed = json.loads(arguments)
            except ValueError:
                return [LlmFailed(message=f"tool call {call.name}: arguments are not complete JSON", retryable=True)]
            if not isinstance(parsed, dict):
                return [LlmFailed(message=f"tool call {call.name}: arguments are not a JSON object", retryable=True)]
            events.append(ToolCallDone(call=ChatToolCall(call_id=call.call_id, name=call.name, arguments=arguments)))
        events.append(LlmFinished(finish_reason=self._finish))
        return events

    def _tool_delta(self, piece: Mapping[str, Any]) -> None:
        index = int(piece.get("index", 0))
        call_id = str(piece.get("id") or "")
        function = piece.get("function") or {}
        call = self._find(index, call_id)
        if call is None:
            call = _PartialCall(index=index, call_id=call_id or f"call_{index}")
            self._calls.append(call)
        if function.get("name"):
            call.name = str(function["name"])
        if function.get("arguments"):
            call.arguments.append(str(function["arguments"]))

    def _find(self, index: int, call_id: str) -> _PartialCall | None:
        for call in reversed(self._calls):
            if call.index != index:
                continue
            # A fragment without an id continues the latest call of its index; a new id starts a new call.
            if not call_id or call.call_id == call_id:
                return call
            return None
        return None


class OpenAICompatibleChat:
    """:class:`~.ports.ChatModel` over HTTP. One client (connection pool) per instance."""

    def __init__(self, config: ChatConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        headers = dict(config.extra_headers)
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(headers=headers, timeout=timeout, trust_env=False)
        self._headers = headers
        self.requests = 0

    @property
    def endpoint(self) -> str:
        return self.config.url.rstrip("/") + "/chat/completions"

    def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str = ""
    ) -> AsyncIterator[LlmEvent]:
        body = chat_request(
            messages,
            tools,
            model=model or self.config.model,
            temperature=self.config.temperature,
            max_tokens=self.config.max_tokens,
        )
        return self._stream(body)

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[LlmEvent]:
        self.requests += 1
        decoder, accumulator = SseDecoder(), ChunkAccumulator()
        try:
            request = self._client.build_request(
                "POST", self.endpoint, content=orjson.dumps(body), headers=self._request_headers()
            )
            response = await self._client.send(request, stream=True)
            try:
                if response.status_code != 200:
                    detail = (await response.aread())[:300].decode("utf-8", errors="replace")
                    retryable = response.status_code in RETRYABLE_STATUSES
                    yield LlmFailed(message=f"HTTP {response.status_code}: {detail}", retryable=retryable)
                    return
                async for data in response.aiter_bytes():
                    for payload in decoder.feed(data):
                        if payload.strip() == DONE:
                            for event in accumulator.end():
                                yield event
                            return
                        for event in accumulator.feed(_chunk(payload)):
                            yield event
                        if accumulator.finished:
                            return
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            yield LlmFailed(message=f"{type(exc).__name__}: {exc}", retryable=True)
            return
        except ValueError as exc:  # malformed JSON or SSE from the server
            yield LlmFailed(message=f"malformed stream: {exc}", retryable=True)
            return
        for event in accumulator.end():  # EOF without [DONE]: complete only if a finish_reason came
            yield event

    def _request_headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", "Accept": "text/event-stream", **self._headers}

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _chunk(payload: str) -> Mapping[str, Any]:
    chunk = orjson.loads(payload)
    if not isinstance(chunk, dict):
        raise ValueError("a chunk must be a JSON object")
    return chunk
