"""The cloud components built by name from profile options and environment keys, against the fakes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.providers.errors import ProviderConfigError
from gateway.providers.fakes.fake_cartesia import CartesiaOptions, FakeCartesiaServer
from gateway.providers.fakes.fake_deepgram import FakeDeepgramServer
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.fakes.fake_openai_speech import FakeOpenAISpeechServer
from gateway.providers.fakes.fake_openai_transcribe import FakeOpenAITranscribeServer
from gateway.providers.pipeline.cloud import factories
from gateway.providers.pipeline.ports import TtsDone
from tests.gateway.providers.pipeline.cloud.helpers import drain

pytestmark = [pytest.mark.timeout(30), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@dataclass
class Spec:
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    urls: Mapping[str, str] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)

    def key(self, vendor: str) -> str:
        return self.keys.get(vendor, "")


def test_register_all_names_every_component_with_its_options() -> None:
    seen: list[tuple[str, str, frozenset[str]]] = []

    def register(kind: str, name: str, factory: Any, *, options: Any = (), summary: str = "") -> None:
        assert callable(factory) and summary
        seen.append((kind, name, frozenset(options)))

    factories.register_all(register)
    assert [(k, n) for k, n, _ in seen] == [
        ("stt", "deepgram"),
        ("stt", "openai"),
        ("tts", "elevenlabs"),
        ("tts", "cartesia"),
        ("tts", "openai"),
    ]
    assert all("url" in options for _, _, options in seen)


def test_one_openai_base_serves_both_dialects() -> None:
    def urls(base: str) -> tuple[str, str]:
        context = Context(urls={"openai": base})
        return factories._openai_url(context, {}, realtime=True), factories._openai_url(context, {}, realtime=False)

    assert urls("https://api.openai.com/v1") == ("wss://api.openai.com/v1/realtime", "https://api.openai.com/v1")
    assert urls("ws://127.0.0.1:9/v1") == ("ws://127.0.0.1:9/v1/realtime", "http://127.0.0.1:9/v1")
    assert urls("http://kokoro:8880") == ("ws://kokoro:8880/v1/realtime", "http://kokoro:8880/v1")
    assert urls("") == ("wss://api.openai.com/v1/realtime", "https://api.openai.com/v1")


async def test_bad_option_values_and_missing_keys_are_config_errors() -> None:
    keyed = Context(keys={"deepgram": "dg", "openai": "sk"})
    with pytest.raises(ProviderConfigError, match="sample_rate"):
        await factories.create_deepgram(Spec({"sample_rate": "fast"}), keyed)
    with pytest.raises(ProviderConfigError, match="linear16"):
        await factories.create_deepgram(Spec({"encoding": "mulaw", "sample_rate": 16000}), keyed)
    with pytest.raises(ProviderConfigError, match="speed"):
        await factories.create_openai_tts(Spec({"speed": 9.0}), keyed)
    with pytest.raises(ProviderConfigError, match="set CARTESIA_API_KEY"):
        await factories.create_cartesia(Spec(), Context())
    with pytest.raises(ProviderConfigError, match="set ELEVENLABS_API_KEY"):
        await factories.create_elevenlabs(Spec({"url": "wss://tts.example.com"}), Context())


async def test_each_component_runs_against_its_fake_from_a_bare_url_override() -> None:
    async with (
        FakeDeepgramServer(api_key="dg") as dg,
        FakeOpenAITranscribeServer(api_key="oa") as oa_stt,
        FakeElevenLabsServer(ElevenLabsOptions(pace=0), api_key="xi") as xi,
        FakeCartesiaServer(CartesiaOptions(pace=0), api_key="ca") as ca,
        FakeOpenAISpeechServer(api_key="oa") as oa_tts,
    ):
        keys = {"deepgram": "dg", "openai": "oa", "elevenlabs": "xi", "cartesia": "ca"}
        stt_context = Context(
            urls={"deepgram": dg.base_url, "openai": f"ws://127.0.0.1:{oa_stt.server.port}"}, keys=keys
        )
        deepgram = await factories.create_deepgram(Spec({"model": "nova-3", "endpointing_ms": 0}), stt_context)
        assert fake_query(dg)["endpointing"] == "false"
        await deepgram.aclose()
        transcribe = await factories.create_openai_stt(Spec({"language": "en"}), stt_context)
        await transcribe.aclose()
        tts_context = Context(
            urls={"elevenlabs": xi.base_url, "cartesia": ca.base_url, "openai": f"http://127.0.0.1:{oa_tts.port}"},
            keys=keys,
        )
        for create, options in (
            (factories.create_elevenlabs, {"voice": "v1", "stability": 0.4}),
            (factories.create_cartesia, {"voice": "v2"}),
            (factories.create_openai_tts, {"voice": "cedar"}),
        ):
            tts = await create(Spec(options), tts_context)
            stream = await tts.open("item-1")
            await stream.push("Hello there. ")
            await stream.flush()
            assert isinstance((await drain(stream.events()))[-1], TtsDone), create.__name__
            await tts.aclose()
    assert xi.record(1).received[0] == {"text": " ", "context_id": "item-1", "voice_settings": {"stability": 0.4}}
    assert ca.record(1).received[0]["voice"] == {"mode": "id", "id": "v2"}
    assert oa_tts.requests[0].body["voice"] == "cedar"


def fake_query(fake: FakeDeepgramServer) -> dict[str, str]:
    return fake.record(1).query
