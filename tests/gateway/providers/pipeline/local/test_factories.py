"""The local components built from the environment and a route's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.local import factories
from gateway.providers.pipeline.local.espeak import EspeakTts
from gateway.providers.pipeline.local.rules import RuleAgent
from gateway.providers.pipeline.local.whisper import WhisperConfig
from tests.gateway.providers.pipeline.local.conftest import require_local_extra


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_PIPELINE_WHISPER_DIR", str(tmp_path))
    monkeypatch.setenv("GATEWAY_PIPELINE_WHISPER_CONTEXT_S", "20")
    monkeypatch.setenv("GATEWAY_PIPELINE_WHISPER_WORKERS", "1")
    monkeypatch.setenv("GATEWAY_PIPELINE_ESPEAK_VOICE", "en-gb")
    settings = factories.LocalSettings()
    assert settings.whisper() == WhisperConfig(model_dir=tmp_path, context_s=20.0, workers=1, threads=2)
    assert settings.espeak_voice == "en-gb" and settings.espeak_wpm == 160


async def test_tts_streams_share_the_loops_engine_and_keep_it_open() -> None:
    first = await factories.create_tts({"wpm": 180})
    second = await factories.create_tts({})
    assert isinstance(first, EspeakTts) and first.engine is second.engine
    assert first.config.wpm == 180 and second.config.wpm == 160 and second.config.voice == "en-us"
    await first.aclose()  # a call's close leaves the worker's helper to the others
    assert factories.shared_espeak_engine() is second.engine
    await second.engine.aclose()


async def test_rules_take_their_options() -> None:
    agent = await factories.create_rules({"transfer_target": "+15550100", "greeting": "Hi."})
    assert isinstance(agent, RuleAgent)
    assert agent.config.transfer_target == "+15550100" and agent.config.greeting == "Hi."


async def test_bad_numbers_are_config_errors() -> None:
    require_local_extra()
    with pytest.raises(ProviderConfigError, match="threshold must be a number"):
        await factories.create_vad({"threshold": "high"})
    with pytest.raises(ProviderConfigError, match="threshold"):
        await factories.create_vad({"threshold": 2})


async def test_the_stt_is_built_on_the_shared_model() -> None:
    require_local_extra()
    stt = await factories.create_stt({"early_decode_ms": 0})
    try:
        assert stt.input_rate == 16000
    finally:
        await stt.aclose()


def test_whisper_is_preloaded_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.providers.pipeline.local import whisper

    assert factories.preload_whisper(factories.LocalSettings()) is None  # off by default: the first call loads it
    require_local_extra()
    monkeypatch.setenv("GATEWAY_PIPELINE_WHISPER_PRELOAD", "1")
    monkeypatch.setattr(whisper, "_shared", {})  # as in a fresh worker process
    settings = factories.LocalSettings()
    thread = factories.preload_whisper(settings)
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()
    # Loaded before any call asked: the first call takes that runtime, with no load of its own.
    assert list(whisper._shared) == [settings.whisper()]


def test_a_preload_that_fails_is_logged_for_the_first_call_to_report(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.providers.pipeline.local import whisper

    def broken(config: WhisperConfig) -> None:
        raise ProviderConfigError("whisper model '/nowhere' failed to load: no model.bin")

    monkeypatch.setattr(whisper, "shared_whisper_sync", broken)
    monkeypatch.setenv("GATEWAY_PIPELINE_WHISPER_PRELOAD", "true")
    thread = factories.preload_whisper()
    assert thread is not None
    thread.join(timeout=10)
    assert "whisper preload failed: whisper model '/nowhere' failed to load: no model.bin" in caplog.text
