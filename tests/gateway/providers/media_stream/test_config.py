"""The websocket provider from the environment and from a routes file's profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.control.config import ConfigError, load_config
from gateway.providers.base import BotSpec
from gateway.providers.errors import ProviderConfigError
from gateway.providers.media_stream.session import WebsocketBotModel
from gateway.providers.registry import ProviderSettings, create_model

ROUTES = """
[[routes]]
name = "bot"
did = "*"
profile = "twilio-bot"

[profiles.twilio-bot]
provider = "websocket"
audio_format = "pcmu"

[profiles.twilio-bot.bot]
url = "wss://bots.example.net/ws/route-token"
audio = "mulaw"
parameters = { tenant = "acme", language = "en" }
"""


def test_settings_build_the_websocket_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_BOT_URL", "ws://127.0.0.1:8765/ws")
    monkeypatch.setenv("GATEWAY_BOT_AUDIO", "l16_16k")
    monkeypatch.setenv("GATEWAY_BOT_TOKEN", "tok")
    monkeypatch.setenv("GATEWAY_BOT_HEADERS", '{"X-Api-Key": "k"}')
    settings = ProviderSettings()
    assert "tok" not in repr(settings) and "X-Api-Key" not in repr(settings)
    model = create_model("websocket", settings)
    assert isinstance(model, WebsocketBotModel)
    assert model.config.url == "ws://127.0.0.1:8765/ws" and model.config.audio == "l16_16k"
    assert model.headers("ws://x") == {"X-Api-Key": "k", "Authorization": "Bearer tok"}
    assert model.capabilities.server_vad and not model.capabilities.quiet_chunks and not model.capabilities.speaks


def test_a_bad_bot_url_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_BOT_URL", "http://127.0.0.1:8765/ws")
    with pytest.raises(ProviderConfigError, match="ws://"):
        create_model("websocket", ProviderSettings())


def test_routes_file_profile_carries_the_bot(tmp_path: Path) -> None:
    file = tmp_path / "routes.toml"
    file.write_text(ROUTES)
    profile = load_config(file).profiles["twilio-bot"].to_agent_profile()
    assert profile.provider == "websocket" and profile.audio_format == "pcmu"
    assert profile.bot == BotSpec(
        url="wss://bots.example.net/ws/route-token", audio="mulaw", parameters={"tenant": "acme", "language": "en"}
    )


def test_routes_file_refuses_a_bot_url_that_is_not_a_websocket(tmp_path: Path) -> None:
    file = tmp_path / "routes.toml"
    file.write_text(ROUTES.replace("wss://bots.example.net", "https://bots.example.net"))
    with pytest.raises(ConfigError, match=r"profiles\.twilio-bot\.bot\.url"):
        load_config(file)
