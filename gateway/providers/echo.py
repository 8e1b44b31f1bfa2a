"""The built-in echo agent: the caller's own audio comes back through the full provider interface, no network.

It exercises the whole path caller -> media -> session -> provider -> session -> media -> caller with no key
and no cloud, and it is what load tests run hundreds of times per core, so it owns no task and no timer:
:meth:`EchoSession.send_audio` queues the frames it got ``delay_frames`` frames ago, synchronously.

Audio: each received 20 ms frame is returned byte-identical and in order, as :class:`AudioReceived` of
exactly one frame, ``delay_frames`` frames later (default 1: the agent answers one frame behind). Partial
frames wait for their remainder. Frames are grouped into response items of ``item_frames`` frames (default 50,
one second) so the session core sees ordinary ResponseStarted / AudioReceived / AudioDone / ResponseDone
sequences and has item ids to truncate; a new item starts with the next frame. Echoed audio is continuous:
there is no gap at an item boundary.

``server_vad`` is True although the agent never reports speech: the echo agent has no turns, and a session
core running its own VAD would "barge in" on every word the caller says, cancelling the caller's own echo
(:meth:`cancel_response` ends the current item with ResponseDone "cancelled" and drops the frames still
held back). Declaring the turn-taking as the provider's keeps the echo continuous.

DTMF: ``send_text("DTMF 5")`` answers with ``TranscriptReceived(role="assistant", text="You pressed 5")``.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    Capabilities,
    HistoryItem,
    ProviderDisconnected,
    ProviderEvent,
    ResponseDone,
    ResponseStarted,
    SessionStarted,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderClosedError, ProviderConnectError

FRAME_BYTES = 960  # one 20 ms frame of 24 kHz PCM16 (telcodecs.frames.FRAME_BYTES)
_DTMF = re.compile(r"^\s*DTMF\s+([0-9A-D*#]+)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class EchoConfig:
    delay_frames: int = 1  # how many frames the echo lags behind the caller (0 = same send_audio call)
    item_frames: int = 50  # frames per response item (1 s)
    queue_frames: int = 500  # events held for a slow reader before the oldest audio is dropped (10 s)

    def __post_init__(self) -> None:
        if self.delay_frames < 0 or self.item_frames < 1 or self.queue_frames < 8:
            raise ValueError("delay_frames >= 0, item_frames >= 1 and queue_frames >= 8 are required")


class EchoSession:
    """One echo "connection". See :class:`gateway.providers.base.RealtimeSession`."""

    def __init__(self, config: EchoConfig, *, session_id: str) -> None:
        self.config = config
        self.session_id = session_id
        self._ids = itertools.count(1)
        self._events: deque[ProviderEvent] = deque()
        self._ready = asyncio.Event()
        self._partial = b""
        self._held: deque[bytes] = deque()
        self._response_id = ""
        self._item_id = ""
        self._item_frames = 0
        self._closed = False
        self.dropped_events = 0  # audio events a reader left unread past queue_frames
        self._push(SessionStarted(session_id=session_id, resumed=False))

    # ------------------------------------------------------------------------------- sending

    async def send_audio(self, pcm: bytes) -> None:
        self.send_audio_nowait(pcm)

    def send_audio_nowait(self, pcm: bytes) -> bool:
        self._check_open()
        data = self._partial + pcm if self._partial else pcm
        whole = len(data) - len(data) % FRAME_BYTES
        self._partial = data[whole:]
        for offset in range(0, whole, FRAME_BYTES):
            self._held.append(data[offset : offset + FRAME_BYTES])
            while len(self._held) > self.config.delay_frames:
                self._emit_frame(self._held.popleft())
        return True

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        self._check_open()
        match = _DTMF.match(text)
        if match:
            digits = match.group(1).upper()
            item_id = f"echo_item_{next(self._ids)}"
            self._push(TranscriptReceived(role="assistant", item_id=item_id, text=f"You pressed {digits}", final=True))

    async def create_response(self, *, instructions: str | None = None) -> None:
        """A response with no audio; its transcript is ``instructions`` when given (e.g. a greeting prompt)."""
        self._check_open()
        self._end_item("completed")
        response_id = f"echo_resp_{next(self._ids)}"
        self._push(ResponseStarted(response_id=response_id))
        if instructions:
            item_id = f"echo_item_{next(self._ids)}"
            self._push(TranscriptReceived(role="assistant", item_id=item_id, text=instructions, final=True))
        self._push(ResponseDone(response_id=response_id, status="completed"))

    async def cancel_response(self) -> None:
        self._check_open()
        self._held.clear()
        self._end_item("cancelled")

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        self._check_open()  # nothing to shorten: the echo agent keeps no conversation

    async def delete_item(self, item_id: str) -> None:
        self._check_open()

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        self._check_open()  # the echo agent never calls tools

    # ------------------------------------------------------------------------------- receiving

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while True:
            while not self._events:
                self._ready.clear()
                await self._ready.wait()
            event = self._events.popleft()
            yield event
            if isinstance(event, ProviderDisconnected):
                return

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._end_item("cancelled")
        self._push(ProviderDisconnected(reason="closed by client", retryable=False))

    # ------------------------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderClosedError("echo session is closed", retryable=False)

    def _emit_frame(self, frame: bytes) -> None:
        if not self._item_id:
            self._response_id = f"echo_resp_{next(self._ids)}"
            self._item_id = f"echo_item_{next(self._ids)}"
            self._item_frames = 0
            self._push(ResponseStarted(response_id=self._response_id))
        self._push(AudioReceived(response_id=self._response_id, item_id=self._item_id, content_index=0, pcm=frame))
        self._item_frames += 1
        if self._item_frames >= self.config.item_frames:
            self._end_item("completed")

    def _end_item(self, status: str) -> None:
        if not self._item_id:
            return
        self._push(AudioDone(response_id=self._response_id, item_id=self._item_id))
        self._push(ResponseDone(response_id=self._response_id, status=status))
        self._item_id = ""

    def _push(self, event: ProviderEvent) -> None:
        if len(self._events) >= self.config.queue_frames:
            # Nobody is reading: forget the oldest audio, never the control events around it.
            for i, queued in enumerate(self._events):
                if isinstance(queued, AudioReceived):
                    del self._events[i]
                    self.dropped_events += 1
                    break
        self._events.append(event)
        self._ready.set()


class EchoModel:
    """The echo agent as a :class:`gateway.providers.base.RealtimeModel`."""

    name = "echo"

    def __init__(self, config: EchoConfig | None = None) -> None:
        self.config = config or EchoConfig()
        self.capabilities = Capabilities(
            server_vad=True,
            truncate=False,
            resume_handle=False,
            max_connection_s=None,
            g711_passthrough=False,
            quiet_chunks=False,  # it echoes each frame: a quiet chunk would delay the echo for the rest of the call
            speaks=False,
        )
        self._sessions = itertools.count(1)

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> EchoSession:
        """A session with nothing to connect to. History and handles are accepted and ignored."""
        if profile.audio_format != "pcm24k":
            raise ProviderConnectError("the echo agent speaks the 24 kHz PCM frame contract only", retryable=False)
        return EchoSession(self.config, session_id=f"echo_{next(self._sessions)}")
