"""The pipeline in the routes file and the environment: parsed, checked at load time, built by name."""

from __future__ import annotations

import pytest

from gateway.control.config import ConfigError, parse_config
from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.registry import ProviderSettings, create_model


def _config(pipeline: dict[str, object]) -> dict[str, object]:
    return {
        "routes": [{"name": "r", "did": "*", "profile": "p"}],
        "profiles": {"p": {"provider": "pipeline", "model": "gpt-4o-mini", "pipeline": pipeline}},
    }


def test_a_profile_names_its_components_and_turn_knobs() -> None:
    config = parse_config(
        _config(
            {
                "stt": {"name": "scripted", "texts": "hello|bye"},
                "llm": {"name": "openai-compatible", "temperature": 0.3},
                "tts": {"name": "synthetic", "ms_per_char": 40},
                "endpoint_ms": 300,
                "min_interrupt_ms": 250,
            }
        ),
        "routes.toml",
    )
    profile = config.profiles["p"].to_agent_profile()
    assert profile.pipeline is not None
    assert profile.pipeline.stt.name == "scripted" and profile.pipeline.stt.options == {"texts": "hello|bye"}
    assert profile.pipeline.llm.options == {"temperature": 0.3}
    assert (profile.pipeline.endpoint_ms, profile.pipeline.min_interrupt_ms, profile.pipeline.vad.name) == (
        300,
        250,
        "energy",
    )


def test_an_unknown_component_or_option_is_refused_at_load_time() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            _config(
                {
                    "stt": {"name": "no-such-stt"},
                    "llm": {"name": "openai-compatible", "voice": "x"},
                    "tts": {"name": "synthetic"},
                }
            ),
            "routes.toml",
        )
    message = str(caught.value)
    assert "routes.toml: profiles.p.pipeline.stt: unknown stt component 'no-such-stt' (known: " in message
    assert "profiles.p.pipeline.llm: openai-compatible has no option voice" in message


def test_a_non_scalar_option_is_refused() -> None:
    with pytest.raises(ConfigError, match="option texts must be a string, number or boolean"):
        parse_config(
            _config(
                {
                    "stt": {"name": "scripted", "texts": ["a"]},
                    "llm": {"name": "openai-compatible"},
                    "tts": {"name": "synthetic"},
                }
            ),
            "routes.toml",
        )


def test_gateway_provider_pipeline_builds_the_model_from_the_environment() -> None:
    settings = ProviderSettings(
        provider="pipeline",
        llm_url="http://127.0.0.1:9/v1",
        deepgram_api_key="dg-secret",
        pipeline_urls="deepgram=ws://127.0.0.1:1",
    )
    model = create_model(None, settings)
    assert isinstance(model, PipelineModel) and model.name == "pipeline"
    assert model.context.urls == {"deepgram": "ws://127.0.0.1:1"} and model.context.key("deepgram") == "dg-secret"
    assert "dg-secret" not in repr(settings) and "dg-secret" not in repr(model.context)
    assert model.capabilities.server_vad and model.capabilities.truncate


def test_an_unknown_default_component_fails_at_start_up() -> None:
    with pytest.raises(ProviderConfigError, match="unknown tts component 'nope'"):
        create_model("pipeline", ProviderSettings(pipeline_tts="nope"))
    with pytest.raises(ProviderConfigError, match="not vendor=url"):
        create_model("pipeline", ProviderSettings(pipeline_urls="deepgram"))
