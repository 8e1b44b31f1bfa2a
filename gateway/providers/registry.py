"""Build a :class:`~gateway.providers.base.RealtimeModel` by name from the environment.

``create_model("echo" | "openai" | "gemini", settings)``. :class:`ProviderSettings` reads, once and frozen:

===========================  ===================================================  =======================
variable                     meaning                                              default
===========================  ===================================================  =======================
GATEWAY_PROVIDER             provider of routes that name none                    ``echo``
OPENAI_API_KEY               OpenAI (or compatible) key                           required for openai*
GATEWAY_OPENAI_URL           realtime websocket URL (Azure, xAI, the fake)        OpenAI's GA endpoint
GATEWAY_OPENAI_MODEL         default model when a profile names none              ``gpt-realtime``
GATEWAY_OPENAI_AUTH_HEADER   header carrying the key (Azure: ``api-key``)         ``Authorization``
GATEWAY_OPENAI_AUTH_SCHEME   prefix of the key in that header (Azure: empty)      ``Bearer``
GEMINI_API_KEY               Gemini API key                                       required for gemini*
GATEWAY_GEMINI_URL           BidiGenerateContent websocket URL                    Google's endpoint
GATEWAY_GEMINI_MODEL         default Gemini Live model                            see gemini.DEFAULT_MODEL
GATEWAY_ECHO_DELAY_FRAMES    echo agent lag in 20 ms frames                       ``1``
GATEWAY_BOT_URL              the ``websocket`` provider's bot (ws:// or wss://)   required for websocket†
GATEWAY_BOT_AUDIO            wire audio: ``mulaw`` (8 kHz), ``l16_16k``, ``l16_24k``  ``mulaw``
GATEWAY_BOT_TOKEN            sent as ``Authorization: Bearer <token>`` (secret)   none
GATEWAY_BOT_HEADERS          JSON object of extra upgrade headers (secret)        none
GATEWAY_BOT_TWILIO_AUTH_TOKEN  signs the upgrade with ``X-Twilio-Signature``       none
GATEWAY_BOT_ACCOUNT_SID      the ``accountSid`` the bot is sent                   ``AC`` + 32 zeros
GATEWAY_BOT_MAX_QUEUED_S     how far ahead of the caller a bot's audio may be     ``60``
===========================  ===================================================  =======================

\\* A key is not required when the URL points at a loopback address (the local fake server, tests).
† Unless every ``websocket`` profile names its own ``bot.url``.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.providers import gemini, openai
from gateway.providers._link import is_loopback_url
from gateway.providers.base import RealtimeModel
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.providers.errors import ProviderConfigError
from gateway.providers.media_stream.protocol import WireAudio
from gateway.providers.media_stream.session import BotConfig, WebsocketBotModel

PROVIDERS = ("echo", "openai", "gemini", "websocket")


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class ProviderSettings(BaseSettings):
    """Provider configuration from the environment (names in the module docstring). Frozen after start-up."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    provider: str = Field(default="echo", validation_alias=_env("GATEWAY_PROVIDER"))
    openai_api_key: str = Field(default="", validation_alias=_env("OPENAI_API_KEY"), repr=False)
    openai_url: str = Field(default=openai.DEFAULT_URL, validation_alias=_env("GATEWAY_OPENAI_URL"))
    openai_model: str = Field(default=openai.DEFAULT_MODEL, validation_alias=_env("GATEWAY_OPENAI_MODEL"))
    openai_auth_header: str = Field(default="Authorization", validation_alias=_env("GATEWAY_OPENAI_AUTH_HEADER"))
    openai_auth_scheme: str = Field(default="Bearer", validation_alias=_env("GATEWAY_OPENAI_AUTH_SCHEME"))
    gemini_api_key: str = Field(default="", validation_alias=_env("GEMINI_API_KEY"), repr=False)
    gemini_url: str = Field(default=gemini.DEFAULT_URL, validation_alias=_env("GATEWAY_GEMINI_URL"))
    gemini_model: str = Field(default=gemini.DEFAULT_MODEL, validation_alias=_env("GATEWAY_GEMINI_MODEL"))
    echo_delay_frames: int = Field(default=1, ge=0, validation_alias=_env("GATEWAY_ECHO_DELAY_FRAMES"))
    bot_url: str = Field(default="", validation_alias=_env("GATEWAY_BOT_URL"), repr=False)
    bot_audio: WireAudio = Field(default="mulaw", validation_alias=_env("GATEWAY_BOT_AUDIO"))
    bot_token: str = Field(default="", validation_alias=_env("GATEWAY_BOT_TOKEN"), repr=False)
    bot_headers: dict[str, str] = Field(default_factory=dict, validation_alias=_env("GATEWAY_BOT_HEADERS"), repr=False)
    bot_twilio_auth_token: str = Field(default="", validation_alias=_env("GATEWAY_BOT_TWILIO_AUTH_TOKEN"), repr=False)
    bot_account_sid: str = Field(
        default="AC" + "0" * 32, pattern=r"^AC[0-9a-fA-F]{32}$", validation_alias=_env("GATEWAY_BOT_ACCOUNT_SID")
    )
    bot_max_queued_s: float = Field(default=60.0, gt=0.0, le=3600.0, validation_alias=_env("GATEWAY_BOT_MAX_QUEUED_S"))


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
    if name == "websocket":
        if settings.bot_url and not settings.bot_url.startswith(("ws://", "wss://")):
            raise ProviderConfigError("websocket: GATEWAY_BOT_URL must start with ws:// or wss://")
        return WebsocketBotModel(
            BotConfig(
                url=settings.bot_url,
                audio=settings.bot_audio,
                token=settings.bot_token,
                headers=settings.bot_headers,
                twilio_auth_token=settings.bot_twilio_auth_token,
                account_sid=settings.bot_account_sid,
                max_queued_s=settings.bot_max_queued_s,
            )
        )
    raise ProviderConfigError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")


def _require_key(variable: str, key: str, url: str, provider: str) -> None:
    if not url.startswith(("ws://", "wss://")):
        raise ProviderConfigError(f"{provider}: URL {url!r} must start with ws:// or wss://")
    if not key and not is_loopback_url(url):
        raise ProviderConfigError(f"{provider}: set {variable} (or point the URL at a local server)")
