"""Whatever a server sends, the adapters' receive callbacks never raise: bad frames are counted and reported."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.providers.pipeline.cloud.cartesia import CartesiaConfig, CartesiaTts
from gateway.providers.pipeline.cloud.deepgram import DeepgramConfig, DeepgramStt
from gateway.providers.pipeline.cloud.elevenlabs import ElevenLabsConfig, ElevenLabsTts, _VoiceSocket
from gateway.providers.pipeline.cloud.openai_transcribe import OpenAITranscribeConfig, OpenAITranscribeStt

scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
# Messages shaped like the vendors' (right keys, any values), so the parsers get past the first lookups.
KEYS = {
    "type": st.sampled_from(
        [
            "Results",
            "SpeechStarted",
            "UtteranceEnd",
            "Metadata",
            "Error",
            "chunk",
            "timestamps",
            "done",
            "error",
            "conversation.item.input_audio_transcription.delta",
            "conversation.item.input_audio_transcription.completed",
            "input_audio_buffer.speech_started",
        ]
    ),
    "context_id": st.just("c"),
    "contextId": st.just("c"),
    "channel": json_values,
    "start": json_values,
    "duration": json_values,
    "is_final": json_values,
    "timestamp": json_values,
    "last_word_end": json_values,
    "data": json_values,
    "word_timestamps": json_values,
    "audio": json_values,
    "alignment": json_values,
    "normalizedAlignment": json_values,
    "isFinal": json_values,
    "item_id": json_values,
    "delta": json_values,
    "transcript": json_values,
    "error": json_values,
    "audio_start_ms": json_values,
    "status_code": json_values,
}
shaped = st.fixed_dictionaries({}, optional=KEYS)
frames = (
    st.binary(max_size=40)
    | st.text(max_size=40)
    | json_values.map(lambda v: orjson.dumps(v).decode())
    | shaped.map(lambda v: orjson.dumps(v).decode())
)


@pytest.fixture
def receivers() -> dict[str, Any]:
    deepgram = DeepgramStt(DeepgramConfig())
    transcribe = OpenAITranscribeStt(OpenAITranscribeConfig())
    cartesia = CartesiaTts(CartesiaConfig())
    elevenlabs = ElevenLabsTts(ElevenLabsConfig())
    return {
        "deepgram": deepgram,
        "transcribe": transcribe,
        "cartesia": cartesia,
        "voice": _VoiceSocket(elevenlabs, "v"),
        "elevenlabs": elevenlabs,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=frames)
async def test_receive_callbacks_never_raise(receivers: dict[str, Any], frame: str | bytes) -> None:
    for name in ("deepgram", "transcribe", "cartesia", "voice"):
        receivers[name]._on_frame(frame)


async def test_garbage_is_counted() -> None:
    stt = DeepgramStt(DeepgramConfig())
    stt._on_frame(b"\xff\x00")
    stt._on_frame('{"type": "Results", "channel": "x"}')
    assert stt.malformed_frames == 2
