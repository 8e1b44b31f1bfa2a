"""Build a :class:`~gateway.providers.base.RealtimeModel` by name from the environment.

``create_model("echo" | "openai" | "gemini", settings)``. :class:`ProviderSettings` reads the environment once
and is frozen; each field's description is its documentation (the table in docs/operations.md is generated
from it). A key is not required when the URL points at a loopback address (the local fake server, tests).
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.providers import gemini, openai
from gateway.providers._link import is_loopback_url
from gateway.providers.base import RealtimeModel
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.providers.errors import ProviderConfigError

PROVIDERS = ("echo", "openai", "gemini")


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class ProviderSettings(BaseSettings):
    """Which provider answers calls, and how each is reached."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    provider: str = Field(
        default="echo",
        validation_alias=_env("GATEWAY_PROVIDER"),
        description="Provider of the profiles that name none (`default`): `echo`, `openai` or `gemini`.",
    )
    openai_api_key: str = Field(
        default="",
        validation_alias=_env("OPENAI_API_KEY"),
        repr=False,
        description="OpenAI (or compatible) API key; needed for `openai` unless its URL is a loopback address.",
    )
    openai_url: str = Field(
        default=openai.DEFAULT_URL,
        validation_alias=_env("GATEWAY_OPENAI_URL"),
        description="Realtime websocket URL (OpenAI's GA endpoint, Azure, xAI, the local fake).",
    )
    openai_model: str = Field(
        default=openai.DEFAULT_MODEL,
        validation_alias=_env("GATEWAY_OPENAI_MODEL"),
        description="Model of the profiles that name none.",
    )
    openai_auth_header: str = Field(
        default="Authorization",
        validation_alias=_env("GATEWAY_OPENAI_AUTH_HEADER"),
        description="Header carrying the key (Azure: `api-key`).",
    )
    openai_auth_scheme: str = Field(
        default="Bearer",
        validation_alias=_env("GATEWAY_OPENAI_AUTH_SCHEME"),
        description="Prefix of the key in that header (Azure: empty).",
    )
    gemini_api_key: str = Field(
        default="",
        validation_alias=_env("GEMINI_API_KEY"),
        repr=False,
        description="Gemini API key; needed for `gemini` unless its URL is a loopback address.",
    )
    gemini_url: str = Field(
        default=gemini.DEFAULT_URL,
        validation_alias=_env("GATEWAY_GEMINI_URL"),
        description="BidiGenerateContent websocket URL.",
    )
    gemini_model: str = Field(
        default=gemini.DEFAULT_MODEL,
        validation_alias=_env("GATEWAY_GEMINI_MODEL"),
        description="Gemini Live model of the profiles that name none.",
    )
    echo_delay_frames: int = Field(
        default=1,
        ge=0,
        validation_alias=_env("GATEWAY_ECHO_DELAY_FRAMES"),
        description="How far the echo agent lags the caller, in 20 ms frames.",
    )


def create_model(name: str | None = None, settings: ProviderSettings | None = None) -> RealtimeModel:
    """The configured provider ``name`` (default: ``settings.provider``).

    Raises :class:`ProviderConfigError` for an unknown name or a missing key.
    """
    settings = settings or ProviderSettings()
    name = (name or settings.provider).strip().lower()
    if name == "echo":
        return EchoModel(EchoConfig(delay_frames=settings.echo_delay_frames))
    if name == "openai":
        _require_key("OPENAI_API_KEY", settings.openai_api_key, settings.openai_url, "openai")
        scheme = settings.openai_auth_scheme.strip()
        config = openai.OpenAIConfig(
            url=settings.openai_url,
            api_key=settings.openai_api_key,
            auth_header=settings.openai_auth_header,
            auth_scheme=f"{scheme} " if scheme else "",
            model=settings.openai_model,
        )
        return openai.OpenAIRealtimeModel(config)
    if name == "gemini":
        _require_key("GEMINI_API_KEY", settings.gemini_api_key, settings.gemini_url, "gemini")
        return gemini.GeminiLiveModel(
            gemini.GeminiConfig(url=settings.gemini_url, api_key=settings.gemini_api_key, model=settings.gemini_model)
        )
    raise ProviderConfigError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")


def _require_key(variable: str, key: str, url: str, provider: str) -> None:
    if not url.startswith(("ws://", "wss://")):
        raise ProviderConfigError(f"{provider}: URL {url!r} must start with ws:// or wss://")
    if not key and not is_loopback_url(url):
        raise ProviderConfigError(f"{provider}: set {variable} (or point the URL at a local server)")
