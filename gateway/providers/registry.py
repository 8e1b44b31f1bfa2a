"""Build a :class:`~gateway.providers.base.RealtimeModel` by name from the environment.

``create_model("echo" | "openai" | "gemini" | "pipeline" | "websocket", settings)``. :class:`ProviderSettings`
reads the environment once and is frozen; each field's description is its documentation (the table in docs/operations.md
is generated from it). A key is not required when the URL points at a loopback address (the local fake server, tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.providers import gemini, openai
from gateway.providers._link import is_loopback_url
from gateway.providers.base import PROVIDERS, ComponentSpec, PipelineSpec, RealtimeModel
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.providers.errors import ProviderConfigError
from gateway.providers.media_stream.protocol import WireAudio
from gateway.providers.media_stream.session import BotConfig, WebsocketBotModel

if TYPE_CHECKING:
    from gateway.providers.pipeline.components import ComponentContext
    from gateway.providers.pipeline.greeting import GreetingRecognisers


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class ProviderSettings(BaseSettings):
    """Which provider answers calls, and how each is reached."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    provider: str = Field(
        default="echo",
        validation_alias=_env("GATEWAY_PROVIDER"),
        description=(
            "Provider of the profiles that name none (`default`): `echo`, `openai`, `gemini`, `pipeline` "
            "or `websocket`."
        ),
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
    pipeline_stt: str = Field(
        default="whisper",
        validation_alias=_env("GATEWAY_PIPELINE_STT"),
        description="Recogniser of `pipeline` profiles that name none (`deepgram`, `openai`, `whisper`, `scripted`).",
    )
    pipeline_llm: str = Field(
        default="rules",
        validation_alias=_env("GATEWAY_PIPELINE_LLM"),
        description="Chat model of `pipeline` profiles that name none (`openai-compatible`, `rules`).",
    )
    pipeline_tts: str = Field(
        default="espeak",
        validation_alias=_env("GATEWAY_PIPELINE_TTS"),
        description=(
            "Voice of `pipeline` profiles that name none (`elevenlabs`, `cartesia`, `openai`, `espeak`, `synthetic`)."
        ),
    )
    pipeline_vad: str = Field(
        default="silero",
        validation_alias=_env("GATEWAY_PIPELINE_VAD"),
        description="Voice detector of `pipeline` profiles that name none (`energy`, `silero`).",
    )
    pipeline_endpoint_ms: int = Field(
        default=500,
        gt=0,
        le=10_000,
        validation_alias=_env("GATEWAY_PIPELINE_ENDPOINT_MS"),
        description="Caller silence (ms) that ends a `pipeline` turn once the recogniser's final text is in.",
    )
    pipeline_component_deadline_s: float = Field(
        default=5.0,
        gt=0.0,
        le=120.0,
        validation_alias=_env("GATEWAY_PIPELINE_COMPONENT_DEADLINE_S"),
        description="A `pipeline` component down this long ends the provider session (the call resumes).",
    )
    llm_url: str = Field(
        default="https://api.openai.com/v1",
        validation_alias=_env("GATEWAY_LLM_URL"),
        description="OpenAI-compatible Chat Completions base URL of `pipeline` (OpenAI, Groq, vLLM, Ollama, the fake).",
    )
    llm_model: str = Field(
        default="gpt-4o-mini",
        validation_alias=_env("GATEWAY_LLM_MODEL"),
        description="Chat model of `pipeline` profiles that name none.",
    )
    llm_api_key: SecretStr = Field(
        default=SecretStr(""),
        validation_alias=_env("GATEWAY_LLM_API_KEY"),
        description="Key of the chat endpoint (falls back to `OPENAI_API_KEY`); none needed on loopback.",
    )
    deepgram_api_key: SecretStr = Field(
        default=SecretStr(""), validation_alias=_env("DEEPGRAM_API_KEY"), description="Deepgram live STT key."
    )
    elevenlabs_api_key: SecretStr = Field(
        default=SecretStr(""), validation_alias=_env("ELEVENLABS_API_KEY"), description="ElevenLabs TTS key."
    )
    cartesia_api_key: SecretStr = Field(
        default=SecretStr(""), validation_alias=_env("CARTESIA_API_KEY"), description="Cartesia TTS key."
    )
    pipeline_urls: str = Field(
        default="",
        validation_alias=_env("GATEWAY_PIPELINE_URLS"),
        description=(
            "Vendor base URL overrides for `pipeline` components: `vendor=url` pairs separated by commas "
            "(fakes, self-hosted)."
        ),
    )
    bot_url: str = Field(
        default="",
        validation_alias=_env("GATEWAY_BOT_URL"),
        repr=False,
        description="The `websocket` provider's bot (ws:// or wss://; a profile's `bot.url` wins). May carry a "
        "token in its path, so it is never logged whole.",
    )
    bot_audio: WireAudio = Field(
        default="mulaw",
        validation_alias=_env("GATEWAY_BOT_AUDIO"),
        description="Audio on the bot's wire: `mulaw` (8 kHz, Twilio's), `l16_16k` or `l16_24k` (PCM16 LE).",
    )
    bot_token: str = Field(
        default="",
        validation_alias=_env("GATEWAY_BOT_TOKEN"),
        repr=False,
        description="Sent to the bot as `Authorization: Bearer <token>` (secret).",
    )
    bot_headers: dict[str, str] = Field(
        default_factory=dict,
        validation_alias=_env("GATEWAY_BOT_HEADERS"),
        repr=False,
        json_schema_extra={"doc_default": "{}"},
        description="Extra headers of the bot's websocket upgrade, a JSON object (secret).",
    )
    bot_twilio_auth_token: str = Field(
        default="",
        validation_alias=_env("GATEWAY_BOT_TWILIO_AUTH_TOKEN"),
        repr=False,
        description="When set, the upgrade carries `X-Twilio-Signature` signed with it, for bots that check.",
    )
    bot_account_sid: str = Field(
        default="AC" + "0" * 32,
        pattern=r"^AC[0-9a-fA-F]{32}$",
        validation_alias=_env("GATEWAY_BOT_ACCOUNT_SID"),
        description="The `accountSid` the bot is sent in `start` and `stop`.",
    )
    bot_max_queued_s: float = Field(
        default=60.0,
        gt=0.0,
        le=3600.0,
        validation_alias=_env("GATEWAY_BOT_MAX_QUEUED_S"),
        description="How far ahead of the caller a bot's audio may be; beyond it, its audio is refused and counted.",
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
    if name == "pipeline":
        return _pipeline(settings)
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


def greeting_recognisers(settings: ProviderSettings | None = None) -> GreetingRecognisers:
    """What builds a profile's ``amd_stt`` (answering-machine detection's words) with the pipeline's keys and URLs."""
    from gateway.providers.pipeline.greeting import GreetingRecognisers

    return GreetingRecognisers(_component_context(settings or ProviderSettings()))


def _pipeline(settings: ProviderSettings) -> RealtimeModel:
    from gateway.providers.pipeline.model import PipelineModel

    spec = PipelineSpec(
        stt=ComponentSpec(name=settings.pipeline_stt),
        llm=ComponentSpec(name=settings.pipeline_llm),
        tts=ComponentSpec(name=settings.pipeline_tts),
        vad=ComponentSpec(name=settings.pipeline_vad),
        endpoint_ms=settings.pipeline_endpoint_ms,
        max_endpoint_ms=max(3000, settings.pipeline_endpoint_ms),
    )
    context = _component_context(settings)
    return PipelineModel(spec, context, component_deadline_s=settings.pipeline_component_deadline_s)


def _component_context(settings: ProviderSettings) -> ComponentContext:
    from gateway.providers.pipeline.components import ComponentContext

    urls: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in settings.pipeline_urls.split(","))):
        vendor, sep, url = pair.partition("=")
        if not sep or not vendor.strip() or not url.strip():
            raise ProviderConfigError(f"GATEWAY_PIPELINE_URLS: {pair!r} is not vendor=url")
        urls[vendor.strip()] = url.strip()
    keys = {
        "llm": settings.llm_api_key.get_secret_value() or settings.openai_api_key,
        "openai": settings.openai_api_key,
        "deepgram": settings.deepgram_api_key.get_secret_value(),
        "elevenlabs": settings.elevenlabs_api_key.get_secret_value(),
        "cartesia": settings.cartesia_api_key.get_secret_value(),
    }
    return ComponentContext(keys=keys, urls=urls, llm_url=settings.llm_url, llm_model=settings.llm_model)


def _require_key(variable: str, key: str, url: str, provider: str) -> None:
    if not url.startswith(("ws://", "wss://")):
        raise ProviderConfigError(f"{provider}: URL {url!r} must start with ws:// or wss://")
    if not key and not is_loopback_url(url):
        raise ProviderConfigError(f"{provider}: set {variable} (or point the URL at a local server)")
