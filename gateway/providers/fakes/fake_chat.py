"""A local OpenAI-compatible Chat Completions server (``POST /v1/chat/completions``, streamed) for tests and load.

It answers every request with ``text/event-stream`` chunks shaped as the ``openai`` SDK's ``ChatCompletionChunk``
(tests validate them with the SDK's models and stream them with ``AsyncOpenAI(base_url=...)``): the scripted text
word by word, then the scripted tool calls (a first delta with ``id``, ``type`` and ``function.name``, then the
arguments in fragments), a ``finish_reason`` chunk, a ``usage`` chunk and ``data: [DONE]``.

Replies come from a script (:class:`ScriptedReply` per request, in order); once it runs out, the default reply
says ``"You said: <last user text>."``. Each reply may wait before its first token (``ttft_s``) and between
tokens (``token_s``), answer with an HTTP error (``status``), or drop the connection after N chunks
(``drop_after_chunks``: the client sees the body end early). Every request body and its headers are recorded
(:attr:`FakeChatServer.requests`), so a test can read exactly what history the pipeline sent.

Served by uvicorn on 127.0.0.1 (port 0 = ephemeral) with a raw ASGI callable; ``GET /healthz`` answers ``ok``.
``python -m gateway.providers.fakes.fake_chat [--port N] [--reply TEXT]`` runs one until interrupted and prints
``listening <url>``, the value for ``GATEWAY_LLM_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn

Scope = Mapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedToolCall:
    name: str
    arguments: str = "{}"
    call_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedReply:
    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    ttft_s: float = 0.0  # before the first chunk
    token_s: float = 0.0  # between chunks
    drop_after_chunks: int = 0  # 0: never; else end the connection abruptly after this many chunks
    status: int = 200  # anything else: a JSON error body with this status


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])


class _Dropped(Exception):
    """Raised inside the ASGI app to make uvicorn abort the connection mid-body."""


def default_reply(body: Mapping[str, Any]) -> ScriptedReply:
    last = ""
    for message in body.get("messages") or ():
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            last = message["content"]
    return ScriptedReply(text=f"You said: {last.strip() or 'nothing'}.")


def tokens(text: str) -> list[str]:
    """Word-sized pieces whose concatenation is ``text`` (each keeps its leading space)."""
    pieces: list[str] = []
    current = ""
    for char in text:
        if char == " " and current.strip():
            pieces.append(current)
            current = ""
        current += char
    if current:
        pieces.append(current)
    return pieces


def reply_chunks(reply: ScriptedReply, *, completion_id: str, model: str, created: int) -> Iterator[dict[str, Any]]:
    """The ``ChatCompletionChunk`` dicts of one streamed reply, in order."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in tokens(reply.text):
        yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        call_id = call.call_id or f"call_{completion_id}_{index}"
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [first]})
        half = len(call.arguments) // 2
        for fragment in (call.arguments[:half], call.arguments[half:]):
            if fragment:
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
    words = len(reply.text.split())
    yield {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words},
    }


class FakeChatServer:
    """Use as ``async with FakeChatServer(script) as fake``; point a client at :attr:`url`."""

    def __init__(
        self,
        script: Sequence[ScriptedReply] = (),
        *,
        default: Callable[[Mapping[str, Any]], ScriptedReply] = default_reply,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.script: deque[ScriptedReply] = deque(script)
        self.default = default
        self.host = host
        self._port = port
        self.requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._change = asyncio.Event()

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("server not started")
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """The API base a client is given (``.../v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def add(self, *replies: ScriptedReply) -> None:
        self.script.extend(replies)

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        self._socket = sock
        config = uvicorn.Config(self, log_level="critical", lifespan="off", access_log=False, proxy_headers=False)
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="fake-chat-serve")
        async with asyncio.timeout(10.0):
            while not self._server.started:
                if self._task.done():
                    await self._task  # raises what made it stop
                    raise RuntimeError("fake chat server stopped while starting")
                await asyncio.sleep(0.005)

    async def aclose(self) -> None:
        server, task, self._task = self._server, self._task, None
        if server is not None and task is not None:
            server.should_exit = True
            await task
        if self._socket is not None:
            self._socket.close()

    async def __aenter__(self) -> FakeChatServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def wait_for_requests(self, count: int, *, within_s: float = 5.0) -> list[RecordedRequest]:
        """Wait until ``count`` requests arrived; TimeoutError after the deadline."""
        async with asyncio.timeout(within_s):
            while len(self.requests) < count:
                self._change.clear()
                await self._change.wait()
        return self.requests[:count]

    # ----------------------------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "GET" and path == "/healthz":
            await _respond(send, 200, {"ok": True, "requests": len(self.requests)})
            return
        if scope["method"] != "POST" or not path.endswith("/chat/completions"):
            await _respond(send, 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            await _respond(send, 400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(RecordedRequest(path=path, headers=headers, body=body, at=time.monotonic()))
        self._change.set()
        reply = self.script.popleft() if self.script else self.default(body)
        if reply.status != 200:
            await _respond(send, reply.status, {"error": {"message": "scripted failure", "type": "server_error"}})
            return
        if not body.get("stream"):
            await _respond(send, 400, {"error": {"message": "this fake streams only", "type": "invalid_request_error"}})
            return
        await self._stream(send, reply, model=str(body.get("model") or "fake-model"))

    async def _stream(self, send: Send, reply: ScriptedReply, *, model: str) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        if reply.ttft_s:
            await asyncio.sleep(reply.ttft_s)
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        chunks = reply_chunks(reply, completion_id=completion_id, model=model, created=int(time.time()))
        for count, chunk in enumerate(chunks, start=1):
            if count > 1 and reply.token_s:
                await asyncio.sleep(reply.token_s)
            await send(
                {"type": "http.response.body", "body": b"data: " + orjson.dumps(chunk) + b"\n\n", "more_body": True}
            )
            if reply.drop_after_chunks and count >= reply.drop_after_chunks:
                raise _Dropped(f"scripted drop after {count} chunks")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _respond(send: Send, status: int, body: Any) -> None:
    data = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the fake runs inside a test's or a bench's own process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(port: int, reply: str, ttft_s: float, token_s: float) -> None:
    def answer(body: Mapping[str, Any]) -> ScriptedReply:
        base = default_reply(body)
        return ScriptedReply(text=reply or base.text, ttft_s=ttft_s, token_s=token_s)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with FakeChatServer(default=answer, port=port) as fake:
        print(f"listening {fake.url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.providers.fakes.fake_chat", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reply", default="", help='every reply (default: "You said: <last user text>.")')
    parser.add_argument("--ttft-ms", type=int, default=0, help="wait before the first chunk")
    parser.add_argument("--token-ms", type=int, default=0, help="wait between chunks")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.reply, args.ttft_ms / 1000, args.token_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
