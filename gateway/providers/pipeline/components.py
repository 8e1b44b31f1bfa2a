"""The pipeline's components by name: a registry of factories, so a profile can say ``stt = "deepgram"``.

Each component kind (``stt``, ``llm``, ``tts``, ``vad``) maps names to a :class:`Registration`: an async factory
and the option names it accepts. Adapter packages register theirs with one line each, e.g. in
``gateway/providers/pipeline/cloud/__init__.py``::

    register("stt", "deepgram", deepgram.create, options=("model", "language", "endpointing_ms"))

:func:`load_plugins` imports the adapter packages that exist (``cloud``, ``local``) once, before the first lookup.
An unknown name or option is a :class:`~gateway.providers.errors.ProviderConfigError` naming what is known, raised
when the routes file is loaded, never on the first call.

A factory gets the :class:`~gateway.providers.base.ComponentSpec` (its options) and a :class:`ComponentContext`
(keys and URLs from the environment) and returns the component for one call: a
:class:`~.ports.SpeechToText` (connected), a :class:`~.ports.ChatModel`, a :class:`~.ports.TextToSpeech` or a
:class:`~.ports.VoiceDetector`.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.providers.base import ComponentSpec, PipelineSpec
from gateway.providers.errors import ProviderConfigError

Kind = Literal["stt", "llm", "tts", "vad"]
KINDS: tuple[Kind, ...] = ("stt", "llm", "tts", "vad")
PLUGIN_PACKAGES = ("gateway.providers.pipeline.cloud", "gateway.providers.pipeline.local")


@dataclass(frozen=True, slots=True, kw_only=True)
class ComponentContext:
    """What factories may read from the environment: vendor keys and URL overrides (fakes, self-hosted).

    ``keys`` maps a vendor (``deepgram``, ``elevenlabs``, ``cartesia``, ``openai``) to its API key; ``urls`` maps a
    vendor to a base URL; ``llm_url``/``llm_model`` are the OpenAI-compatible chat endpoint and default model.
    """

    keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    urls: Mapping[str, str] = field(default_factory=dict)
    llm_url: str = "https://api.openai.com/v1"
    llm_model: str = "gpt-4o-mini"

    def key(self, vendor: str) -> str:
        return self.keys.get(vendor, "")


Factory = Callable[[ComponentSpec, ComponentContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    kind: Kind
    name: str
    factory: Factory
    options: frozenset[str]
    summary: str = ""


_REGISTRY: dict[tuple[Kind, str], Registration] = {}
_plugins_loaded = False


def register(kind: Kind, name: str, factory: Factory, *, options: Iterable[str] = (), summary: str = "") -> None:
    """Make ``name`` usable as a component of ``kind``. Registering a name again replaces it."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    _REGISTRY[(kind, name)] = Registration(
        kind=kind, name=name, factory=factory, options=frozenset(options), summary=summary
    )


def load_plugins() -> None:
    """Import the adapter packages present in this install (each registers its components on import)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for package in PLUGIN_PACKAGES:
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as exc:
            if exc.name != package:
                raise


def names(kind: Kind) -> list[str]:
    load_plugins()
    return sorted(name for k, name in _REGISTRY if k == kind)


def lookup(kind: Kind, name: str) -> Registration:
    load_plugins()
    registration = _REGISTRY.get((kind, name))
    if registration is None:
        known = ", ".join(names(kind)) or "none"
        raise ProviderConfigError(f"pipeline: unknown {kind} component {name!r} (known: {known})")
    return registration


def component_problems(kind: Kind, component: ComponentSpec) -> list[str]:
    """What is wrong with one component: an unknown name, or options it does not take (empty: valid)."""
    try:
        registration = lookup(kind, component.name)
    except ProviderConfigError as exc:
        return [str(exc).removeprefix("pipeline: ")]
    unknown = sorted(set(component.options) - registration.options)
    if unknown:
        allowed = ", ".join(sorted(registration.options)) or "none"
        return [f"{component.name} has no option {', '.join(unknown)} (options: {allowed})"]
    return []


def problems(spec: PipelineSpec) -> list[str]:
    """Every unknown component or option of ``spec``, as ``<kind>: <problem>`` lines (empty: valid)."""
    found: list[str] = []
    for kind, component in _components(spec):
        found += [f"{kind}: {problem}" for problem in component_problems(kind, component)]
    if not 0 < spec.endpoint_ms <= spec.max_endpoint_ms:
        found.append("endpoint_ms: must be above 0 and at most max_endpoint_ms")
    return found


def check(spec: PipelineSpec) -> None:
    """Raise :class:`ProviderConfigError` listing every problem of ``spec``."""
    found = problems(spec)
    if found:
        raise ProviderConfigError("pipeline: " + "; ".join(found))


async def build(kind: Kind, component: ComponentSpec, context: ComponentContext) -> Any:
    return await lookup(kind, component.name).factory(component, context)


def _components(spec: PipelineSpec) -> list[tuple[Kind, ComponentSpec]]:
    return [("stt", spec.stt), ("llm", spec.llm), ("tts", spec.tts), ("vad", spec.vad)]


# ------------------------------------------------------------------------------------ built-in components


async def _openai_compatible(spec: ComponentSpec, context: ComponentContext) -> Any:
    from gateway.providers.pipeline.chat import ChatConfig, OpenAICompatibleChat

    options = spec.options
    temperature = options.get("temperature")
    max_tokens = options.get("max_tokens")
    config = ChatConfig(
        url=str(options.get("url") or context.llm_url),
        model=str(options.get("model") or context.llm_model),
        api_key=context.key("llm") or context.key("openai"),
        temperature=float(temperature) if temperature is not None else None,
        max_tokens=int(max_tokens) if max_tokens is not None else None,
    )
    return OpenAICompatibleChat(config)


async def _energy(spec: ComponentSpec, context: ComponentContext) -> Any:
    from gateway.providers.pipeline.vad import EnergyDetector

    threshold = spec.options.get("threshold_dbfs", -40.0)
    return EnergyDetector(threshold_dbfs=float(threshold))


async def _scripted_stt(spec: ComponentSpec, context: ComponentContext) -> Any:
    from gateway.providers.pipeline.synthetic import ScriptedStt

    texts = str(spec.options.get("texts", "")).split("|")
    return ScriptedStt(texts=tuple(t for t in texts if t), final_delay_ms=int(spec.options.get("final_delay_ms", 0)))


async def _synthetic_tts(spec: ComponentSpec, context: ComponentContext) -> Any:
    from gateway.providers.pipeline.synthetic import SyntheticTts

    return SyntheticTts(
        ms_per_char=int(spec.options.get("ms_per_char", 60)),
        timestamps=bool(spec.options.get("timestamps", True)),
        first_audio_ms=int(spec.options.get("first_audio_ms", 0)),
    )


register(
    "llm",
    "openai-compatible",
    _openai_compatible,
    options=("model", "url", "temperature", "max_tokens"),
    summary="OpenAI Chat Completions over HTTP (OpenAI, Groq, vLLM, Ollama, llama-server)",
)
register("vad", "energy", _energy, options=("threshold_dbfs",), summary="per-20 ms RMS level against a threshold")
register(
    "stt",
    "scripted",
    _scripted_stt,
    options=("texts", "final_delay_ms"),
    summary="offline: each utterance (energy VAD) is given the next scripted text; for tests and load",
)
register(
    "tts",
    "synthetic",
    _synthetic_tts,
    options=("ms_per_char", "timestamps", "first_audio_ms"),
    summary="offline: voice-like tones with exact word timings; for tests and load",
)
