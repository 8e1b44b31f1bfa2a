"""Building the local components for one call, from the environment and a route's component options.

The variables are :class:`LocalSettings`' fields, each described once in its ``Field(description=...)`` (the
table in docs/operations.md is generated from them).

Route options (``[profile.pipeline.stt]`` and so on; the names each factory accepts are in :data:`OPTIONS`):
``stt = "whisper"``: ``early_decode_ms``, ``preroll_ms``, ``vad_threshold``; ``vad = "silero"``: ``threshold``;
``tts = "espeak"``: ``voice``, ``wpm``; ``llm = "rules"``: ``transfer_target``, ``greeting``.

The Whisper model and the espeak-ng helper are shared by every call of the process: the first call loads them
(off the event loop), later calls reuse them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.local.espeak import EspeakConfig, EspeakEngine, EspeakTts
from gateway.providers.pipeline.local.rules import RuleAgent, RuleAgentConfig
from gateway.providers.pipeline.local.whisper import WhisperConfig

Options = Mapping[str, Any]
log = logging.getLogger(__name__)

OPTIONS: Mapping[str, tuple[str, ...]] = {
    "stt": ("early_decode_ms", "preroll_ms", "vad_threshold"),
    "vad": ("threshold",),
    "tts": ("voice", "wpm"),
    "llm": ("transfer_target", "greeting"),
}


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class LocalSettings(BaseSettings):
    """The local pipeline components (Whisper, espeak-ng): read once, frozen."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    whisper_dir: Path | None = Field(
        default=None,
        validation_alias=_env("GATEWAY_PIPELINE_WHISPER_DIR"),
        description="An operator's CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json), loaded "
        "like the packaged one; unset: the packaged tiny.en.",
    )
    whisper_context_s: float = Field(
        default=15.0,
        validation_alias=_env("GATEWAY_PIPELINE_WHISPER_CONTEXT_S"),
        description="Audio context the Whisper encoder sees, in seconds (30 is plain Whisper).",
    )
    whisper_workers: int = Field(
        default=0,
        ge=0,
        validation_alias=_env("GATEWAY_PIPELINE_WHISPER_WORKERS"),
        description="Whisper decodes at once per worker process, capped at the cores; 0: the cores.",
    )
    whisper_preload: bool = Field(
        default=False,
        validation_alias=_env("GATEWAY_PIPELINE_WHISPER_PRELOAD"),
        description="Load Whisper in a thread when the worker starts, so that its first call (a pipeline's STT or "
        "a profile's amd_stt) does not wait the load: about a second, more on a busy machine, where answering-"
        "machine detection's words would miss their hold. Off: loaded on the first call that needs it.",
    )
    whisper_threads: int = Field(
        default=2,
        ge=1,
        validation_alias=_env("GATEWAY_PIPELINE_WHISPER_THREADS"),
        description="CPU threads inside one Whisper decode, capped at the cores.",
    )
    espeak_voice: str = Field(
        default="en-us",
        validation_alias=_env("GATEWAY_PIPELINE_ESPEAK_VOICE"),
        description="espeak-ng voice when the profile names none.",
    )
    espeak_wpm: int = Field(
        default=160,
        validation_alias=_env("GATEWAY_PIPELINE_ESPEAK_WPM"),
        description="espeak-ng speaking rate, in words per minute.",
    )

    def whisper(self) -> WhisperConfig:
        return WhisperConfig(
            model_dir=self.whisper_dir,
            context_s=self.whisper_context_s,
            workers=self.whisper_workers,
            threads=self.whisper_threads,
        )


def preload_whisper(settings: LocalSettings | None = None) -> threading.Thread | None:
    """With ``GATEWAY_PIPELINE_WHISPER_PRELOAD``, the process's Whisper loading in a daemon thread (started);
    a call that needs it meanwhile waits for this load instead of starting another. None when off."""
    from gateway.providers.pipeline.local.whisper import shared_whisper_sync

    settings = settings or LocalSettings()
    if not settings.whisper_preload:
        return None
    config = settings.whisper()

    def load() -> None:
        try:
            shared_whisper_sync(config)
        except ProviderConfigError as exc:  # the first call that needs it fails the same way, and says so
            log.error("whisper preload failed: %s", exc)

    thread = threading.Thread(target=load, name="whisper-preload", daemon=True)
    thread.start()
    return thread


def _number(options: Options, name: str, default: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProviderConfigError(f"pipeline option {name} must be a number, got {value!r}")
    return float(value)


async def create_stt(options: Options, settings: LocalSettings | None = None) -> Any:
    """A :class:`~.stt.LocalWhisperStt` on the process's Whisper (loaded on first use, off the loop)."""
    from gateway.providers.pipeline.local.stt import LocalWhisperStt
    from gateway.providers.pipeline.local.vad import SileroVad
    from gateway.providers.pipeline.local.whisper import shared_whisper

    settings = settings or LocalSettings()
    runtime = await shared_whisper(settings.whisper())
    return LocalWhisperStt(
        runtime,
        SileroVad(threshold=_number(options, "vad_threshold", 0.5)),
        early_decode_ms=int(_number(options, "early_decode_ms", 200)),
        preroll_ms=int(_number(options, "preroll_ms", 300)),
    )


async def create_vad(options: Options, settings: LocalSettings | None = None) -> Any:
    from gateway.providers.pipeline.local.vad import SileroVad

    return SileroVad(threshold=_number(options, "threshold", 0.5))


_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EspeakEngine] = weakref.WeakKeyDictionary()


def shared_espeak_engine() -> EspeakEngine:
    """The event loop's espeak-ng helper (one per worker process)."""
    loop = asyncio.get_running_loop()
    engine = _engines.get(loop)
    if engine is None:
        engine = _engines[loop] = EspeakEngine()
    return engine


async def create_tts(options: Options, settings: LocalSettings | None = None) -> Any:
    settings = settings or LocalSettings()
    config = EspeakConfig(
        voice=str(options.get("voice") or settings.espeak_voice),
        wpm=int(_number(options, "wpm", settings.espeak_wpm)),
    )
    return EspeakTts(config, engine=shared_espeak_engine())


async def create_rules(options: Options, settings: LocalSettings | None = None) -> Any:
    defaults = RuleAgentConfig()
    return RuleAgent(
        RuleAgentConfig(
            transfer_target=str(options.get("transfer_target") or ""),
            greeting=str(options.get("greeting") or defaults.greeting),
        )
    )
