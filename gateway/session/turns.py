"""Turn-taking state of one call, synchronous and O(1) per tick: agent playout, the provider's current response,
whether the caller is speaking, barge-in decisions, pending response requests and round-trip latency (also
reported to an optional :data:`LatencyObserver`, with how long provider audio waited to be played).

Barge-in is idempotent: a response is interrupted at most once, and with nothing queued and no response running
there is nothing to interrupt, so simultaneous triggers (server VAD, provider interruption, local VAD) cancel
playback once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.providers.base import AudioDone, AudioReceived
from gateway.session.config import SessionConfig
from gateway.session.events import InterruptedItem
from gateway.session.playout import FrameAudio, PlayoutBuffer, comfort_tone_frame
from gateway.session.stats import RoundTrips
from gateway.session.vad import EnergyVad
from telcodecs.frames import G711Law

_COMFORT_PERIOD = 100  # frames: a 200 ms tone every 2 s
_COMFORT_ON = 10


#: ``(kind, seconds)``: "round_trip" (caller speech stopped -> the reply's first frame to the caller) or
#: "agent_audio_wait" (a provider item's first audio received -> its first frame to the caller).
LatencyObserver = Callable[[Literal["round_trip", "agent_audio_wait"], float], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Interruption:
    response_id: str | None  # the running response to cancel, if any
    items: tuple[InterruptedItem, ...]  # provider items the caller did not hear to the end


@dataclass(frozen=True, slots=True, kw_only=True)
class Cut:
    """What an interruption did: the response cut, each item's sent/received audio, cancel and truncate sent."""

    response_id: str
    items: tuple[InterruptedItem, ...]
    cancelled: bool
    truncated: bool


class Turns:
    def __init__(
        self,
        config: SessionConfig,
        *,
        server_vad: bool,
        clock: Callable[[], float],
        on_latency: LatencyObserver | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._on_latency = on_latency
        self.playout = PlayoutBuffer()
        self.vad = None if server_vad else EnergyVad(config.local_vad)
        self.round_trips = RoundTrips()
        self._comfort = comfort_tone_frame() if config.comfort_tone else None
        self.active_response: str | None = None
        self._interrupted_response: str | None = None
        self.responses_started = 0
        self.caller_speaking = False
        self._speech_stopped_at: float | None = None
        self._reply_wait_since: float | None = None
        self._response_requested_at: float | None = None
        self._response_wanted: tuple[str | None] | None = None
        self._was_playing = False
        self.audio_gaps = 0  # times playout ran dry while the item playing was still arriving

    # ------------------------------------------------------------------------------ provider side

    def audio(self, event: AudioReceived, *, law: G711Law | None = None) -> None:
        """A provider delta: PCM16, or G.711 codes of ``law`` from a provider in G.711 mode."""
        self.playout.add(
            response_id=event.response_id,
            item_id=event.item_id,
            content_index=event.content_index,
            pcm=event.pcm,
            law=law,
            at=self._clock(),
        )

    def audio_done(self, event: AudioDone) -> None:
        self.playout.finish_audio(response_id=event.response_id, item_id=event.item_id)

    def response_started(self, response_id: str) -> None:
        self.active_response = response_id
        self.responses_started += 1
        self._response_requested_at = None
        self._reply_wait_since = None

    def response_done(self, response_id: str) -> tuple[str | None] | None:
        """Returns the deferred response request (its instructions) that may now be sent, if any."""
        self.playout.finish_response(response_id)
        if self.active_response == response_id or not response_id:
            self.active_response = None
        if self.active_response is None and self._response_wanted is not None:
            wanted, self._response_wanted = self._response_wanted, None
            return wanted
        return None

    def provider_stopped(self) -> None:
        """The provider ended its response itself (Gemini interrupted)."""
        self.active_response = None

    def new_connection(self) -> None:
        self.active_response = None
        self._interrupted_response = None
        self._response_requested_at = None
        self._response_wanted = None
        self.caller_speaking = False

    # -------------------------------------------------------------------------------- caller side

    def caller_started(self) -> None:
        self.caller_speaking = True
        self._speech_stopped_at = None

    def caller_stopped(self) -> None:
        self.caller_speaking = False
        now = self._clock()
        self._speech_stopped_at = now
        self._reply_wait_since = now

    def interrupt(self) -> Interruption | None:
        """Drop queued agent audio and the running response's later deltas; None when nothing was interrupted."""
        response = self.active_response if self.active_response != self._interrupted_response else None
        items = tuple(i for i in self.playout.interrupt(also_drop=response) if i.content_index >= 0)
        self._was_playing = False
        if not items and response is None:
            return None
        if response is not None:
            self._interrupted_response = response
        return Interruption(response_id=response, items=items)

    def response_for_hold(self) -> str | None:
        """The running response a hold cancels (None: none runs, or it was cancelled already). Its delivered audio
        stays queued and its later deltas are kept; a barge-in after the hold does not cancel it again."""
        response = self.active_response
        if response is None or response == self._interrupted_response:
            return None
        self._interrupted_response = response
        return response

    def silence_agent(self) -> None:
        """Stop all agent audio without a barge-in (the connection is going away; its markers are forgotten)."""
        self.playout.interrupt(also_drop=self.active_response)
        self.playout.take_markers()
        self._was_playing = False

    def play_prompt(self, pcm: bytes) -> None:
        self.playout.clear()
        self.playout.add_prompt(pcm)

    # --------------------------------------------------------------------------------------- tick

    def next_frame(self, now: float, *, index: int, resuming: bool) -> tuple[FrameAudio | None, bool]:
        """The agent frame to send this tick (or a comfort tone while resuming) and whether playout just drained."""
        popped = self.playout.pop()
        if popped is None:
            drained = self._was_playing
            if drained and self.playout.starved:
                self.audio_gaps += 1
            self._was_playing = False
            if resuming and self._comfort is not None and index % _COMFORT_PERIOD < _COMFORT_ON:
                return self._comfort, drained
            return None, drained
        audio, item = popped
        self._was_playing = True
        if item.content_index >= 0:  # provider audio, not a prompt
            if self._speech_stopped_at is not None:
                waited = now - self._speech_stopped_at
                self.round_trips.add(waited * 1000.0)
                self._speech_stopped_at = None
                if self._on_latency is not None:
                    self._on_latency("round_trip", waited)
            if item.played_at is None:
                item.played_at = now
                if item.received_at is not None and self._on_latency is not None:
                    self._on_latency("agent_audio_wait", now - item.received_at)
        return audio, False

    # -------------------------------------------------------------------------------- conditions

    @property
    def agent_quiet(self) -> bool:
        return not self.playout.playing and self.active_response is None

    @property
    def between_turns(self) -> bool:
        return self.agent_quiet and not self.caller_speaking

    def idle(self, now: float) -> bool:
        """Nobody speaks and no reply is running or about to start (server VAD replies shortly after speech)."""
        if not self.between_turns or self.response_outstanding(now):
            return False
        return self._reply_wait_since is None or now - self._reply_wait_since >= self._config.reply_wait_s

    def response_outstanding(self, now: float) -> bool:
        at = self._response_requested_at
        return at is not None and now - at < 2 * self._config.reply_wait_s

    def want_response(self, instructions: str | None) -> bool:
        """A response is wanted. True: send create_response now. False: deferred or already coming."""
        if self.active_response is not None:
            if self._response_wanted is None or instructions is not None:
                self._response_wanted = (instructions,)
            return False
        now = self._clock()
        if instructions is None and self.response_outstanding(now):
            return False
        self._response_requested_at = now
        return True

    def response_request_dropped(self) -> None:
        self._response_requested_at = None
