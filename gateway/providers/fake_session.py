"""The per-connection protocol of the fake OpenAI Realtime server (:mod:`gateway.providers.fake_server`).

:class:`FakeConnection` is the GA state machine of one websocket: session configuration, the energy VAD over
``input_audio_buffer.append`` (speech_started / speech_stopped / committed with audio_start_ms / audio_end_ms),
responses that echo the caller's turn or play generated audio, ``response.cancel``, truncate and delete with
the real service's errors, a scripted tool call, and the fault actions (drop, expire, error).
:class:`FakeOptions` holds the behaviour; :class:`ConnectionRecord` what a connection received.
Event shapes follow ``openai.types.realtime`` (the tests validate every emitted event against it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pybase64
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway.providers import fake_audio
from gateway.providers._link import cancel_and_wait
from gateway.providers.fake_audio import AudioFormat, EnergyVad
from gateway.providers.fakes.vendor_server import with_query

log = logging.getLogger(__name__)

Mode = Literal["echo", "tone", "speech-like"]
RecordMode = Literal["all", "meta", "none"]

CLIENT_EVENT_TYPES = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeOptions:
    """Behaviour of the fake. Every field can be overridden per connection by a query parameter."""

    mode: Mode = "echo"
    reply_ms: int = 1000  # length of generated (tone / speech-like) replies
    paced: bool = False  # send reply audio in real time instead of all at once
    pace: float = 1.0  # speed of paced replies against real time (2.0: twice as fast as it plays)
    chunk_ms: int = 100  # audio per response.output_audio.delta
    vad_threshold_dbfs: float = -45.0
    tool_name: str = ""  # when set, the first turn is answered with a call of this function
    tool_arguments: str = "{}"
    tool_turn: int = 1  # the caller turn (1: the first) answered with the tool call; earlier ones get audio
    reply_delay_s: float = 0.0
    # The first reply's transcript ("" keeps the default), streamed as output_audio_transcript deltas spread
    # evenly over its audio deltas, each sent just before the audio delta it goes with.
    reply_transcript: str = ""
    session_delay_s: float = 0.0  # a slow handshake: wait this long before session.created
    drop_after_s: float = 0.0  # 0 = never; abort the TCP connection (the client sees 1006)
    drop_after_frames: int = 0  # abort after this many 20 ms frames of caller audio
    expire_after_s: float = 0.0  # error session_expired, then close 1001
    error_after_frames: int = 0  # send one error event after this many caller frames
    error_code: str = "server_error"
    error_type: str = "server_error"
    error_message: str = "injected error"
    # The faults above hit only the first N connections of the server (0: every connection), so a client's
    # reconnect after an injected drop gets a healthy session.
    fault_connections: int = 0
    record: RecordMode = "all"

    def __post_init__(self) -> None:
        if self.mode not in ("echo", "tone", "speech-like"):
            raise ValueError(f"mode must be echo, tone or speech-like, not {self.mode!r}")
        if self.record not in ("all", "meta", "none"):
            raise ValueError(f"record must be all, meta or none, not {self.record!r}")
        if self.tool_turn < 1:
            raise ValueError("tool_turn must be >= 1")
        if self.chunk_ms <= 0 or self.reply_ms < 0:
            raise ValueError("chunk_ms must be positive and reply_ms non-negative")
        if not self.pace > 0:
            raise ValueError(f"pace must be positive, not {self.pace!r}")
        if self.fault_connections < 0:
            raise ValueError("fault_connections must be >= 0")

    def without_faults(self) -> FakeOptions:
        return dataclasses.replace(
            self, drop_after_s=0.0, drop_after_frames=0, expire_after_s=0.0, error_after_frames=0
        )

    def with_query(self, query: Mapping[str, str]) -> FakeOptions:
        return with_query(self, query)


# Keys of server events copied into the timeline (enough to place turns, responses and items in time).
_TIMELINE_KEYS = ("item_id", "response_id", "call_id", "audio_start_ms", "audio_end_ms")


@dataclass(slots=True, kw_only=True)
class ConnectionRecord:
    """What one connection saw. ``audio`` holds the caller audio in arrival order (record="all" only).

    ``timeline`` (record="all" only) interleaves client events received (``dir`` "in", ``index`` into
    ``events``) and server events sent (``dir`` "out", with their item/response ids and audio positions), each
    with the wall-clock time ``t``, so a test can order what the client did against the turns the fake saw.
    """

    id: int
    path: str
    headers: dict[str, str]
    options: FakeOptions
    started_at: float
    events: list[dict[str, Any]] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    audio_bytes: int = 0
    audio_sha256: Any = field(default_factory=hashlib.sha256)
    truncations: list[dict[str, Any]] = field(default_factory=list)
    deletions: list[str] = field(default_factory=list)
    cancels: int = 0
    tool_outputs: list[dict[str, Any]] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None
    close_code: int | None = None

    def remember(self, message: dict[str, Any], audio: bytes | None) -> None:
        mode = self.options.record
        if audio is not None:
            self.audio_bytes += len(audio)
            self.audio_sha256.update(audio)
            if mode == "all":
                self.audio += audio
            elif mode == "meta":
                message = {"type": message["type"], "audio_bytes": len(audio)}
        if mode != "none":
            self.events.append(message)
        if mode == "all":
            self.timeline.append(
                {"t": time.time(), "dir": "in", "type": message.get("type", ""), "index": len(self.events) - 1}
            )

    def sent(self, event: dict[str, Any]) -> None:
        if self.options.record == "all":
            entry = {"t": time.time(), "dir": "out", "type": event.get("type", "")}
            entry.update((key, event[key]) for key in _TIMELINE_KEYS if key in event)
            response = event.get("response")
            if isinstance(response, dict):
                entry.update(response_id=response.get("id"), status=response.get("status"))
            self.timeline.append(entry)

    def event_types(self) -> list[str]:
        return [e.get("type", "") for e in self.events]

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "close_code": self.close_code,
            "events": len(self.events),
            "audio_bytes": self.audio_bytes,
            "audio_sha256": self.audio_sha256.hexdigest(),
            "truncations": self.truncations,
            "deletions": self.deletions,
            "cancels": self.cancels,
            "tool_outputs": self.tool_outputs,
            "responses": self.responses,
        }

    def detail(self) -> dict[str, Any]:
        return {**self.summary(), "headers": self.headers, "event_list": self.events, "timeline": self.timeline}


class FakeConnection:
    """One client connection: its session state, VAD, active response and fault timers."""

    def __init__(self, ws: ServerConnection, record: ConnectionRecord, *, on_change: Callable[[], None]) -> None:
        self.ws = ws
        self._on_change = on_change
        self.record = record
        self.options = record.options
        self.session_id = f"sess_fake_{record.id}"
        self._ids = itertools.count(1)
        self._send_lock = asyncio.Lock()
        self.session: dict[str, Any] = {"type": "realtime", "object": "realtime.session", "id": self.session_id}
        self.format: AudioFormat = "audio/pcm"
        self.prefix_ms = 300
        self.create_response = True
        self.interrupt_response = True
        self.transcribe = False
        self.vad: EnergyVad | None = EnergyVad(self.format, threshold_dbfs=self.options.vad_threshold_dbfs)
        self.buffer = bytearray()  # caller audio of the current turn (plus prefix padding while idle)
        self.buffer_start_ms = 0
        self.turn_item_id = ""
        self.frames = 0
        self.last_turn_audio = b""
        self.items_audio_ms: dict[str, int] = {}
        self.turns = 0
        self.tool_used = False
        self.pending_tool_output = ""
        self.response_task: asyncio.Task[None] | None = None
        self.response_id = ""
        self.tasks: set[asyncio.Task[None]] = set()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_{self.record.id}_{next(self._ids)}"

    async def send(self, event: dict[str, Any]) -> None:
        event.setdefault("event_id", self.next_id("event"))
        async with self._send_lock:
            await self.ws.send(orjson.dumps(event), text=True)
            self.record.sent(event)

    def spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"fake-{self.record.id}-{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        opts = self.options
        if opts.drop_after_s > 0:
            self.spawn(self._later(opts.drop_after_s, self.drop), "drop")
        if opts.expire_after_s > 0:
            self.spawn(self._later(opts.expire_after_s, self.expire), "expire")
        if opts.session_delay_s > 0:
            await asyncio.sleep(opts.session_delay_s)
        await self.send({"type": "session.created", "session": dict(self.session)})
        async for raw in self.ws:
            try:
                message = orjson.loads(raw)
            except orjson.JSONDecodeError:
                message = None
            if not isinstance(message, dict):
                await self.error("invalid_json", "Expected a JSON object")
                continue
            audio = None
            if message.get("type") == "input_audio_buffer.append":
                try:
                    audio = pybase64.b64decode(message.get("audio") or "", validate=True)
                except ValueError:
                    await self.error("invalid_value", "input_audio_buffer.append: audio is not valid base64")
                    continue
            self.record.remember(message, audio)
            self._on_change()
            if audio is not None:
                await self.on_audio(audio)
            else:
                await self.handle(message)

    async def _later(self, delay_s: float, action: Callable[[], Awaitable[None]]) -> None:
        await asyncio.sleep(delay_s)
        await action()

    async def aclose(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, ConnectionClosed | OSError):
                log.warning("fake connection %d: task failed: %r", self.record.id, result)

    # ------------------------------------------------------------------------------------- faults

    async def drop(self) -> None:
        """Vanish without a close frame, as a crashed server or a dead network path does."""
        self.ws.transport.abort()

    async def expire(self) -> None:
        message = "Your session hit the maximum duration of 60 minutes."
        await self.error("session_expired", message, error_type="invalid_request_error")
        await self.ws.close(1001, "session expired")

    async def error(self, code: str, message: str, *, error_type: str = "invalid_request_error") -> None:
        await self.send({"type": "error", "error": {"type": error_type, "code": code, "message": message}})

    # ----------------------------------------------------------------------------------- handlers

    async def handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type", "")
        handler = getattr(self, "on_" + kind.replace(".", "_"), None)
        if kind not in CLIENT_EVENT_TYPES or handler is None:
            await self.error("invalid_value", f"Invalid value: '{kind}'. Supported values are client event types.")
            return
        try:
            await handler(message)
        except (KeyError, TypeError, ValueError) as exc:
            await self.error("invalid_request_error", f"Invalid '{kind}' event: {exc!r}")

    async def on_session_update(self, message: dict[str, Any]) -> None:
        update = message.get("session") or {}
        self.session.update({k: v for k, v in update.items() if k != "audio"})
        audio = update.get("audio") or {}
        if audio:
            merged = self.session.setdefault("audio", {})
            for direction in ("input", "output"):
                merged.setdefault(direction, {}).update(audio.get(direction) or {})
        audio_input = self.session.get("audio", {}).get("input", {})
        self.format = (audio_input.get("format") or {}).get("type", "audio/pcm")
        self.transcribe = bool(audio_input.get("transcription"))
        detection = audio_input.get("turn_detection", {"type": "server_vad"})
        if detection is None:
            self.vad = None
        else:
            self.prefix_ms = int(detection.get("prefix_padding_ms", 300))
            self.create_response = bool(detection.get("create_response", True))
            self.interrupt_response = bool(detection.get("interrupt_response", True))
            self.vad = EnergyVad(
                self.format,
                threshold_dbfs=self.options.vad_threshold_dbfs,
                silence_ms=int(detection.get("silence_duration_ms", 500)),
            )
        self.buffer.clear()
        self.buffer_start_ms = 0
        await self.send({"type": "session.updated", "session": dict(self.session)})

    async def on_audio(self, data: bytes) -> None:
        """``input_audio_buffer.append``, already decoded (once) by :meth:`run`."""
        frame_bytes = fake_audio.bytes_per_ms(self.format) * 20
        frames_before = self.frames
        self.frames = (self.record.audio_bytes) // frame_bytes
        opts = self.options
        if opts.error_after_frames and frames_before < opts.error_after_frames <= self.frames:
            await self.error(opts.error_code, opts.error_message, error_type=opts.error_type)
        if opts.drop_after_frames and self.frames >= opts.drop_after_frames:
            await self.drop()
            return
        self.buffer += data
        if self.vad is None:
            return
        for decision in self.vad.feed(data):
            if decision.kind == "started":
                await self._speech_started(decision.ms)
            else:
                await self._speech_stopped(decision.ms)
        if not self.vad.speaking:
            self._trim_idle_buffer()

    def _trim_idle_buffer(self) -> None:
        per_ms = fake_audio.bytes_per_ms(self.format)
        excess = len(self.buffer) - self.prefix_ms * per_ms
        excess -= excess % per_ms  # whole milliseconds keep buffer_start_ms exact
        if excess > 0:
            del self.buffer[:excess]
            self.buffer_start_ms += excess // per_ms

    async def _speech_started(self, start_ms: int) -> None:
        # The turn keeps prefix_padding_ms before the detected start, however large the appends that carried it.
        keep_from_ms = max(self.buffer_start_ms, start_ms - self.prefix_ms)
        del self.buffer[: (keep_from_ms - self.buffer_start_ms) * fake_audio.bytes_per_ms(self.format)]
        self.buffer_start_ms = keep_from_ms
        self.turn_item_id = self.next_id("item")
        await self.send(
            {"type": "input_audio_buffer.speech_started", "audio_start_ms": start_ms, "item_id": self.turn_item_id}
        )
        if self.interrupt_response and self.response_task is not None:
            await self._cancel_response(reason="turn_detected")

    async def _speech_stopped(self, end_ms: int) -> None:
        item_id = self.turn_item_id
        await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": end_ms, "item_id": item_id})
        end = (end_ms - self.buffer_start_ms) * fake_audio.bytes_per_ms(self.format)
        await self._commit(bytes(self.buffer[:end]), item_id)
        del self.buffer[:end]
        self.buffer_start_ms = end_ms
        if self.create_response and self.response_task is None:
            self._start_response(self.last_turn_audio)

    async def _commit(self, audio: bytes, item_id: str) -> None:
        self.turns += 1
        self.last_turn_audio = audio
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": None})
        item = {"id": item_id, "type": "message", "role": "user", "status": "completed", "content": []}
        await self.send({"type": "conversation.item.added", "item": {**item, "object": "realtime.item"}})
        if self.transcribe:
            ms = len(audio) // fake_audio.bytes_per_ms(self.format)
            await self.send(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item_id,
                    "content_index": 0,
                    "transcript": f"[{ms} ms of caller audio]",
                    "usage": {"type": "duration", "seconds": ms / 1000},
                }
            )

    async def on_input_audio_buffer_commit(self, message: dict[str, Any]) -> None:
        await self._commit(bytes(self.buffer), self.next_id("item"))
        self.buffer_start_ms += len(self.buffer) // fake_audio.bytes_per_ms(self.format)
        self.buffer.clear()

    async def on_input_audio_buffer_clear(self, message: dict[str, Any]) -> None:
        self.buffer_start_ms += len(self.buffer) // fake_audio.bytes_per_ms(self.format)
        self.buffer.clear()
        await self.send({"type": "input_audio_buffer.cleared"})

    async def on_output_audio_buffer_clear(self, message: dict[str, Any]) -> None:
        await self.error("invalid_request_error", "output_audio_buffer.clear is only supported for WebRTC and SIP")

    async def on_conversation_item_create(self, message: dict[str, Any]) -> None:
        item = dict(message["item"])
        item.setdefault("id", self.next_id("item"))
        item.update(object="realtime.item", status="completed")
        if item.get("type") == "function_call_output":
            self.record.tool_outputs.append({"call_id": item.get("call_id"), "output": item.get("output")})
            self.pending_tool_output = str(item.get("output", ""))
        await self.send({"type": "conversation.item.added", "item": item, "previous_item_id": None})
        await self.send({"type": "conversation.item.done", "item": item, "previous_item_id": None})

    async def on_conversation_item_retrieve(self, message: dict[str, Any]) -> None:
        await self.error("item_retrieve_invalid_item_id", f"Item {message.get('item_id')!r} is not retrievable here")

    async def on_conversation_item_truncate(self, message: dict[str, Any]) -> None:
        item_id = str(message["item_id"])
        audio_end_ms = int(message["audio_end_ms"])
        if item_id not in self.items_audio_ms:
            await self.error("item_truncate_invalid_item_id", f"Item with item_id '{item_id}' not found")
            return
        have_ms = self.items_audio_ms[item_id]
        if audio_end_ms > have_ms:
            await self.error("invalid_value", f"Audio content of {have_ms}ms is already shorter than {audio_end_ms}ms")
            return
        self.items_audio_ms[item_id] = audio_end_ms
        self.record.truncations.append({"item_id": item_id, "audio_end_ms": audio_end_ms})
        self._on_change()
        await self.send(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": int(message.get("content_index", 0)),
                "audio_end_ms": audio_end_ms,
            }
        )

    async def on_conversation_item_delete(self, message: dict[str, Any]) -> None:
        item_id = str(message["item_id"])
        self.items_audio_ms.pop(item_id, None)
        self.record.deletions.append(item_id)
        self._on_change()
        await self.send({"type": "conversation.item.deleted", "item_id": item_id})

    async def on_response_create(self, message: dict[str, Any]) -> None:
        if self.response_task is not None:
            await self.error(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response_id}.",
            )
            return
        instructions = str((message.get("response") or {}).get("instructions") or "")
        self._start_response(self.last_turn_audio, instructions=instructions, allow_tool=False)

    async def on_response_cancel(self, message: dict[str, Any]) -> None:
        self.record.cancels += 1
        self._on_change()
        if self.response_task is None:
            await self.error("response_cancel_not_active", "Cancellation failed: no active response found")
            return
        await self._cancel_response(reason="client_cancelled")

    # ---------------------------------------------------------------------------------- responses

    def _start_response(self, turn_audio: bytes, *, instructions: str = "", allow_tool: bool = True) -> None:
        self.response_id = self.next_id("resp")
        self.record.responses.append(self.response_id)
        call_tool = (
            allow_tool and bool(self.options.tool_name) and not self.tool_used and self.turns >= self.options.tool_turn
        )
        coro = self._respond(self.response_id, turn_audio, instructions=instructions, call_tool=call_tool)
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"fake-{self.record.id}-{self.response_id}")
        self.response_task = task
        self.tasks.add(task)
        task.add_done_callback(self._response_finished)

    def _response_finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if self.response_task is task:
            self.response_task = None

    async def _cancel_response(self, *, reason: str) -> None:
        task, response_id = self.response_task, self.response_id
        if task is None:
            return
        self.response_task = None
        await cancel_and_wait(task)
        details = {"type": "cancelled", "reason": reason}
        response = {"id": response_id, "object": "realtime.response", "status": "cancelled", "status_details": details}
        await self.send({"type": "response.done", "response": {**response, "output": []}})

    async def _respond(self, response_id: str, turn_audio: bytes, *, instructions: str, call_tool: bool) -> None:
        if self.options.reply_delay_s > 0:
            await asyncio.sleep(self.options.reply_delay_s)
        response = {"id": response_id, "object": "realtime.response", "output": []}
        await self.send({"type": "response.created", "response": {**response, "status": "in_progress"}})
        if call_tool:
            self.tool_used = True
            item = {
                "id": self.next_id("item"),
                "type": "function_call",
                "call_id": self.next_id("call"),
                "name": self.options.tool_name,
                "arguments": self.options.tool_arguments,
                "object": "realtime.item",
            }
            where = {"response_id": response_id, "output_index": 0}
            await self.send({"type": "response.output_item.added", **where, "item": {**item, "status": "in_progress"}})
            await self.send(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "item_id": item["id"],
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
            await self.send({"type": "response.output_item.done", **where, "item": {**item, "status": "completed"}})
            await self.send({"type": "response.done", "response": {**response, "status": "completed"}})
            return
        audio = self._reply_audio(turn_audio)
        transcript = instructions or (f"tool said {self.pending_tool_output}" if self.pending_tool_output else "")
        streamed = not transcript and self.options.reply_transcript and len(self.record.responses) == 1
        transcript = transcript or (self.options.reply_transcript if streamed else f"{self.options.mode} reply")
        self.pending_tool_output = ""
        await self._stream_audio(response_id, audio, transcript, stream_transcript=bool(streamed))
        await self.send({"type": "response.done", "response": {**response, "status": "completed"}})

    def _reply_audio(self, turn_audio: bytes) -> bytes:
        mode = self.options.mode
        if mode == "echo" and turn_audio:
            return turn_audio
        if mode == "speech-like":
            return fake_audio.speech_like(self.format, self.options.reply_ms, seed=self.turns)
        return fake_audio.tone(self.format, self.options.reply_ms)

    async def _stream_audio(
        self, response_id: str, audio: bytes, transcript: str, *, stream_transcript: bool = False
    ) -> None:
        item_id = self.next_id("item")
        item = {"id": item_id, "type": "message", "role": "assistant", "object": "realtime.item"}
        where = {"response_id": response_id, "output_index": 0}
        at = {**where, "item_id": item_id, "content_index": 0}
        await self.send(
            {"type": "response.output_item.added", **where, "item": {**item, "status": "in_progress", "content": []}}
        )
        self.items_audio_ms[item_id] = 0
        per_ms = fake_audio.bytes_per_ms(self.format)
        chunk = max(1, self.options.chunk_ms) * per_ms
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        words = transcript.split(" ") if stream_transcript else []
        chunks = max(1, -(-len(audio) // chunk))
        for number, offset in enumerate(range(0, len(audio), chunk)):
            piece = audio[offset : offset + chunk]
            if self.options.paced:
                # Absolute deadlines: real-time pacing that does not drift with send latency.
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                deadline += len(piece) / per_ms / 1000 / self.options.pace
            share = words[len(words) * number // chunks : len(words) * (number + 1) // chunks]
            if share:
                text = " ".join(share) + ("" if number == chunks - 1 else " ")
                await self.send({"type": "response.output_audio_transcript.delta", **at, "delta": text})
            await self.send({"type": "response.output_audio.delta", **at, "delta": pybase64.b64encode(piece).decode()})
            self.items_audio_ms[item_id] = self.items_audio_ms.get(item_id, 0) + len(piece) // per_ms
        await self.send({"type": "response.output_audio.done", **at})
        await self.send({"type": "response.output_audio_transcript.done", **at, "transcript": transcript})
        content = [{"type": "output_audio", "transcript": transcript}]
        await self.send(
            {"type": "response.output_item.done", **where, "item": {**item, "status": "completed", "content": content}}
        )
