"""The cloud components by name: one factory per adapter, from a profile's options and the environment's keys.

Each factory takes a component spec (``options``: the profile's ``stt = { name = "deepgram", model = ... }``
table) and a context (``key(vendor)``, ``urls[vendor]``: ``DEEPGRAM_API_KEY`` and friends, and
``GATEWAY_PIPELINE_URLS`` overrides pointing a vendor at a fake or a self-hosted server) and returns a component
for one call: a started :class:`~..ports.SpeechToText` or a :class:`~..ports.TextToSpeech`. A bad option value is
a :class:`~gateway.providers.errors.ProviderConfigError`. :data:`CLOUD_COMPONENTS` lists them for a registry
(:func:`register_all`); the options each accepts are documented in docs/operations.md ("Pipeline components:
cloud").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from gateway.providers._link import is_loopback_url
from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.cloud import cartesia, deepgram, elevenlabs, openai_speech, openai_transcribe
from gateway.providers.pipeline.ports import SpeechToText, TextToSpeech

Option = str | int | float | bool


class SpecLike(Protocol):
    @property
    def options(self) -> Mapping[str, Option]: ...


class ContextLike(Protocol):
    @property
    def urls(self) -> Mapping[str, str]: ...

    def key(self, vendor: str) -> str: ...


Factory = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudComponent:
    kind: str  # "stt" | "tts"
    name: str
    factory: Factory
    options: tuple[str, ...]
    summary: str


def _url(context: ContextLike, options: Mapping[str, Option], vendor: str, default: str, path: str) -> str:
    """The option ``url``, else the vendor's override (a bare base gets the endpoint's path), else the default."""
    base = str(options.get("url") or context.urls.get(vendor) or "")
    if not base:
        return default
    if urlsplit(base).path in ("", "/"):
        return base.rstrip("/") + path
    return base


def _openai_url(context: ContextLike, options: Mapping[str, Option], *, realtime: bool) -> str:
    """One ``openai`` base serves both dialects: ``https://host/v1`` becomes ``wss://host/v1/realtime`` for the
    transcription session and stays as it is for ``/audio/speech`` (and the other way round)."""
    base = str(options.get("url") or context.urls.get("openai") or "")
    if not base:
        return openai_transcribe.DEFAULT_URL if realtime else openai_speech.DEFAULT_URL
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    if realtime:
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        path = path if path.endswith("/realtime") else (path or "/v1") + "/realtime"
    else:
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        path = path.removesuffix("/realtime") or "/v1"
    return parts._replace(scheme=scheme, path=path).geturl()


def _opt(options: Mapping[str, Option], name: str, kind: type, default: Any) -> Any:
    if name not in options:
        return default
    value = options[name]
    try:
        if kind is bool:
            return value if isinstance(value, bool) else str(value).lower() in {"1", "true", "yes", "on"}
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ProviderConfigError(f"pipeline: option {name} must be a {kind.__name__}, not {value!r}") from exc


def _build(make: Callable[[], Any], name: str) -> Any:
    try:
        return make()
    except ValueError as exc:
        raise ProviderConfigError(f"pipeline: {name}: {exc}") from exc


_KEY_VARIABLES = {
    "deepgram": "DEEPGRAM_API_KEY",
    "elevenlabs": "ELEVENLABS_API_KEY",
    "cartesia": "CARTESIA_API_KEY",
    "openai": "OPENAI_API_KEY",
}


def _key(context: ContextLike, vendor: str, url: str) -> str:
    """The vendor's key; none is needed on loopback (the fakes), anywhere else its absence is a config error."""
    key = context.key(vendor)
    if not key and not is_loopback_url(url):
        raise ProviderConfigError(
            f"pipeline: {vendor}: set {_KEY_VARIABLES[vendor]} (or point its url at a local server)"
        )
    return key


def _off_when_zero(value: int | None) -> int | None:
    return None if value is None or value <= 0 else value


async def create_deepgram(spec: SpecLike, context: ContextLike) -> deepgram.DeepgramStt:
    o = spec.options
    keyterms = tuple(t for t in str(o.get("keyterms", "")).split("|") if t)
    url = _url(context, o, "deepgram", deepgram.DEFAULT_URL, "/v1/listen")
    api_key = _key(context, "deepgram", url)
    config = _build(
        lambda: deepgram.DeepgramConfig(
            url=url,
            api_key=api_key,
            model=_opt(o, "model", str, "nova-3"),
            language=_opt(o, "language", str, "en"),
            encoding=_opt(o, "encoding", str, "linear16"),
            sample_rate=_opt(o, "sample_rate", int, 16000),
            interim_results=_opt(o, "interim_results", bool, True),
            endpointing_ms=_off_when_zero(_opt(o, "endpointing_ms", int, 300)),
            utterance_end_ms=_off_when_zero(_opt(o, "utterance_end_ms", int, 1000)),
            vad_events=_opt(o, "vad_events", bool, True),
            smart_format=_opt(o, "smart_format", bool, True),
            punctuate=_opt(o, "punctuate", bool, True),
            keyterms=keyterms,
            keepalive_s=_opt(o, "keepalive_s", float, 4.0),
        ),
        "deepgram",
    )
    return await deepgram.open_deepgram(config)


async def create_openai_stt(spec: SpecLike, context: ContextLike) -> openai_transcribe.OpenAITranscribeStt:
    o = spec.options
    url = _openai_url(context, o, realtime=True)
    api_key = _key(context, "openai", url)
    config = _build(
        lambda: openai_transcribe.OpenAITranscribeConfig(
            url=url,
            api_key=api_key,
            model=_opt(o, "model", str, "gpt-4o-mini-transcribe"),
            language=_opt(o, "language", str, ""),
            prompt=_opt(o, "prompt", str, ""),
            turn_detection=_opt(o, "turn_detection", str, "server_vad"),
            silence_duration_ms=_opt(o, "silence_duration_ms", int, 500),
        ),
        "openai stt",
    )
    return await openai_transcribe.open_openai_transcribe(config)


async def create_elevenlabs(spec: SpecLike, context: ContextLike) -> elevenlabs.ElevenLabsTts:
    o = spec.options
    settings = {
        name: _opt(o, name, float, 0.0) for name in ("stability", "similarity_boost", "style", "speed") if name in o
    }
    url = _url(context, o, "elevenlabs", elevenlabs.DEFAULT_URL, "")
    api_key = _key(context, "elevenlabs", url)
    config = _build(
        lambda: elevenlabs.ElevenLabsConfig(
            url=url,
            api_key=api_key,
            model=_opt(o, "model", str, "eleven_flash_v2_5"),
            voice=_opt(o, "voice", str, ""),
            language=_opt(o, "language", str, ""),
            auto_mode=_opt(o, "auto_mode", bool, False),
            apply_text_normalization=_opt(o, "apply_text_normalization", str, ""),
            inactivity_timeout_s=_opt(o, "inactivity_timeout_s", int, 60),
            voice_settings=settings or None,
        ),
        "elevenlabs",
    )
    return elevenlabs.ElevenLabsTts(config)


async def create_cartesia(spec: SpecLike, context: ContextLike) -> cartesia.CartesiaTts:
    o = spec.options
    url = _url(context, o, "cartesia", cartesia.DEFAULT_URL, "/tts/websocket")
    api_key = _key(context, "cartesia", url)
    config = _build(
        lambda: cartesia.CartesiaConfig(
            url=url,
            api_key=api_key,
            model=_opt(o, "model", str, "sonic-3"),
            voice=_opt(o, "voice", str, ""),
            language=_opt(o, "language", str, "en"),
            max_buffer_delay_ms=_opt(o, "max_buffer_delay_ms", int, 0),
        ),
        "cartesia",
    )
    return cartesia.CartesiaTts(config)


async def create_openai_tts(spec: SpecLike, context: ContextLike) -> openai_speech.OpenAISpeechTts:
    o = spec.options
    speed = _opt(o, "speed", float, None)
    url = _openai_url(context, o, realtime=False)
    api_key = _key(context, "openai", url)
    config = _build(
        lambda: openai_speech.OpenAISpeechConfig(
            url=url,
            api_key=api_key,
            model=_opt(o, "model", str, "gpt-4o-mini-tts"),
            voice=_opt(o, "voice", str, "marin"),
            instructions=_opt(o, "instructions", str, ""),
            speed=speed,
        ),
        "openai tts",
    )
    return openai_speech.OpenAISpeechTts(config)


CLOUD_COMPONENTS: tuple[CloudComponent, ...] = (
    CloudComponent(
        kind="stt",
        name="deepgram",
        factory=create_deepgram,
        options=(
            "url",
            "model",
            "language",
            "encoding",
            "sample_rate",
            "interim_results",
            "endpointing_ms",
            "utterance_end_ms",
            "vad_events",
            "smart_format",
            "punctuate",
            "keyterms",
            "keepalive_s",
        ),
        summary="Deepgram live STT over its websocket; drops healed with the audio replayed",
    ),
    CloudComponent(
        kind="stt",
        name="openai",
        factory=create_openai_stt,
        options=("url", "model", "language", "prompt", "turn_detection", "silence_duration_ms"),
        summary="OpenAI Realtime transcription session (intent=transcription)",
    ),
    CloudComponent(
        kind="tts",
        name="elevenlabs",
        factory=create_elevenlabs,
        options=(
            "url",
            "model",
            "voice",
            "language",
            "auto_mode",
            "apply_text_normalization",
            "inactivity_timeout_s",
            "stability",
            "similarity_boost",
            "style",
            "speed",
        ),
        summary="ElevenLabs multi-context websocket, pcm_24000, word timings from character alignment",
    ),
    CloudComponent(
        kind="tts",
        name="cartesia",
        factory=create_cartesia,
        options=("url", "model", "voice", "language", "max_buffer_delay_ms"),
        summary="Cartesia websocket, one context per reply, word timestamps",
    ),
    CloudComponent(
        kind="tts",
        name="openai",
        factory=create_openai_tts,
        options=("url", "model", "voice", "instructions", "speed"),
        summary="OpenAI-compatible /v1/audio/speech, 24 kHz PCM streamed, no timestamps (estimated)",
    ),
)


def register_all(register: Callable[..., None]) -> None:
    """Register every cloud component with a registry's ``register(kind, name, factory, options=, summary=)``."""
    for component in CLOUD_COMPONENTS:
        register(
            component.kind, component.name, component.factory, options=component.options, summary=component.summary
        )


def _conforms(
    deepgram_stt: deepgram.DeepgramStt,
    openai_stt: openai_transcribe.OpenAITranscribeStt,
    elevenlabs_tts: elevenlabs.ElevenLabsTts,
    cartesia_tts: cartesia.CartesiaTts,
    openai_tts: openai_speech.OpenAISpeechTts,
) -> tuple[SpeechToText, SpeechToText, TextToSpeech, TextToSpeech, TextToSpeech]:
    """Never called: mypy checks here that each adapter is what the pipeline's ports ask for."""
    return deepgram_stt, openai_stt, elevenlabs_tts, cartesia_tts, openai_tts
