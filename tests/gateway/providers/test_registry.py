"""create_model: names, environment, missing keys."""

from __future__ import annotations

import pytest

from gateway.providers.echo import EchoModel
from gateway.providers.errors import ProviderConfigError
from gateway.providers.gemini import GeminiLiveModel
from gateway.providers.openai import OpenAIRealtimeModel
from gateway.providers.registry import ProviderSettings, create_model

VARIABLES = (
    "GATEWAY_PROVIDER",
    "OPENAI_API_KEY",
    "GATEWAY_OPENAI_URL",
    "GATEWAY_OPENAI_MODEL",
    "GATEWAY_OPENAI_AUTH_HEADER",
    "GATEWAY_OPENAI_AUTH_SCHEME",
    "GEMINI_API_KEY",
    "GATEWAY_GEMINI_URL",
    "GATEWAY_GEMINI_MODEL",
    "GATEWAY_ECHO_DELAY_FRAMES",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_default_is_echo() -> None:
    model = create_model()
    assert isinstance(model, EchoModel)
    assert model.config.delay_frames == 1


def test_environment_selects_and_configures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("GATEWAY_OPENAI_URL", "wss://example.invalid/openai/v1/realtime")
    monkeypatch.setenv("GATEWAY_OPENAI_AUTH_HEADER", "api-key")
    monkeypatch.setenv("GATEWAY_OPENAI_AUTH_SCHEME", "")
    model = create_model()
    assert isinstance(model, OpenAIRealtimeModel)
    assert model.config.url == "wss://example.invalid/openai/v1/realtime"
    assert model.headers() == {"api-key": "sk-test"}
    assert "sk-test" not in repr(ProviderSettings())


def test_bearer_scheme_gets_its_space(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = create_model("openai")
    assert isinstance(model, OpenAIRealtimeModel)
    assert model.headers() == {"Authorization": "Bearer sk-test"}
    assert model.capabilities.max_connection_s == 3600


def test_missing_keys_are_clear() -> None:
    with pytest.raises(ProviderConfigError, match="OPENAI_API_KEY"):
        create_model("openai")
    with pytest.raises(ProviderConfigError, match="GEMINI_API_KEY"):
        create_model("gemini")
    with pytest.raises(ProviderConfigError, match="unknown provider 'nope'"):
        create_model("nope")


def test_loopback_urls_need_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_OPENAI_URL", "ws://127.0.0.1:8765/v1/realtime")
    monkeypatch.setenv("GATEWAY_GEMINI_URL", "ws://localhost:9000/ws")
    openai_model = create_model("openai")
    assert isinstance(openai_model, OpenAIRealtimeModel) and openai_model.headers() == {}
    gemini_model = create_model("gemini")
    assert isinstance(gemini_model, GeminiLiveModel)
    assert gemini_model.capabilities.resume_handle is True


def test_explicit_settings_and_bad_url() -> None:
    settings = ProviderSettings(gemini_api_key="g", gemini_url="https://not-a-websocket")
    with pytest.raises(ProviderConfigError, match="ws://"):
        create_model("gemini", settings)
    assert isinstance(create_model("ECHO", ProviderSettings(echo_delay_frames=0)), EchoModel)
    with pytest.raises(ValueError):
        ProviderSettings(echo_delay_frames=-1)
