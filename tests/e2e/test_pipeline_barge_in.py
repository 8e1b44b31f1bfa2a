"""The cascaded pipeline end to end: a baresip phone calls ``gateway run`` whose provider is ``pipeline`` and talks
over the agent. Two set-ups: offline components (scripted recogniser, synthetic voice with exact word timings), and
the cloud adapters against their vendors' fakes (Deepgram and ElevenLabs over websockets, via
``GATEWAY_PIPELINE_URLS``); the chat model is the fake Chat Completions server over HTTP in both.

What must hold: the caller's barge-in stops the agent, and the NEXT Chat Completions request holds exactly the
words whose audio started before the milliseconds the gateway sent to the phone, and the call's own transcript
(ops API) holds that same prefix. The expected words come from the voice's own timeline (the synthetic voice's
formula; what the ElevenLabs fake was asked to say and its speech layout), never from the pipeline's alignment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.pipeline.words import word_spans
from tests.e2e.gateway_proc import start_gateway
from tests.e2e.provider_harness import barge_in_lines, caller_wav, only_call, session_counters
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

TURN_A = "Hello, I would like to check my order status, please."  # 4.1 s
TURN_C = "Wait, one more thing please."  # 2.4 s
MS_PER_CHAR = 60
LONG_REPLY = (
    "Your order four five seven two left our warehouse yesterday morning, "
    "and the courier expects to deliver it on Friday before noon."
)


def _config(path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                "[[routes]]",
                'name = "all"',
                'did = "*"',
                'profile = "agent"',
                "",
                "[profiles.agent]",
                'provider = "pipeline"',
                'model = "fake-llm"',
                'instructions = "You are a test agent."',
                "",
                "[profiles.agent.pipeline]",
                "endpoint_ms = 400",
                "min_interrupt_ms = 400",
                'stt = { name = "scripted", texts = "check my order|stop please" }',
                'llm = { name = "openai-compatible" }',
                f'tts = {{ name = "synthetic", ms_per_char = {MS_PER_CHAR} }}',
                'vad = { name = "energy", threshold_dbfs = -50.0 }',
            ]
        )
        + "\n"
    )
    return path


def expected_heard(text: str, sent_ms: int) -> str:
    """The synthetic voice's timeline, computed independently: each word lasts MS_PER_CHAR per character and is
    followed by one character of silence; a word counts once its start was sent."""
    at, cut = 0, 0
    for start, end in word_spans(text):
        if at < sent_ms:
            cut = end
        at += (end - start + 1) * MS_PER_CHAR
    return text[:cut].strip()


async def test_a_barge_in_leaves_exactly_the_heard_words_in_the_next_request(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    async with FakeChatServer([ScriptedReply(text=LONG_REPLY, token_s=0.01), ScriptedReply(text="Sure.")]) as chat:
        gateway = await start_gateway(
            peer_procs,
            env={
                "GATEWAY_PROVIDER": "pipeline",
                "GATEWAY_LLM_URL": chat.url,
                "GATEWAY_CONFIG": str(_config(tmp_path / "gateway.toml")),
                "OPENAI_API_KEY": "",
            },
        )
        # The agent starts about 0.45 s after turn A; turn C starts 1.5 s after it, well inside the ~8 s reply.
        source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.5, TURN_C, 2.0])
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            await phone.wait_closed(within=40)
        counters = await session_counters(gateway)
        assert counters["resumes"] == 0
        requests = chat.requests
        assert len(requests) == 2, [r.messages for r in requests]

    (cut,) = barge_in_lines(gateway)
    assert cut.trigger == "speech_started"
    ((_item_id, (sent_ms, received_ms)),) = cut.items.items()
    assert 0 < sent_ms < received_ms, "the reply had not played further than it arrived: nothing to prove"
    heard = expected_heard(LONG_REPLY, sent_ms)
    assert heard and heard != LONG_REPLY.strip()

    first, second = requests[0].messages, requests[1].messages
    assert first == [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "check my order"},
    ]
    assert second[1:] == [
        {"role": "user", "content": "check my order"},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "stop please"},
    ], json.dumps(second, indent=1)

    call = await only_call(gateway)
    lines = [(line["role"], line["text"]) for line in call["transcript"] if line["text"]]
    assert ("assistant", heard) in lines and ("assistant", LONG_REPLY) not in lines
    assert lines[:3] == [("user", "check my order"), ("assistant", heard), ("user", "stop please")]


def _cloud_config(path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                "[[routes]]",
                'name = "all"',
                'did = "*"',
                'profile = "agent"',
                "",
                "[profiles.agent]",
                'provider = "pipeline"',
                'model = "fake-llm"',
                'voice = "test-voice"',
                'instructions = "You are a test agent."',
                "",
                "[profiles.agent.pipeline]",
                "endpoint_ms = 400",
                "min_interrupt_ms = 400",
                'stt = { name = "deepgram", endpointing_ms = 300 }',
                'llm = { name = "openai-compatible" }',
                'tts = { name = "elevenlabs" }',
                'vad = { name = "energy", threshold_dbfs = -50.0 }',
            ]
        )
        + "\n"
    )
    return path


async def test_a_cloud_pipeline_call_over_sip_keeps_exactly_the_heard_words(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    """The same call with Deepgram and ElevenLabs (their fakes, over websockets) in the gateway process."""
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    reply = "Your order left our warehouse yesterday morning. The courier will deliver it on Friday before noon."
    # espeak's softest syllables dip below the fake's default -45 dBFS: a turn would end mid-sentence.
    deepgram = FakeDeepgramServer(
        DeepgramOptions(transcripts=("check my order", "stop please"), vad_threshold_dbfs=-60)
    )
    eleven = FakeElevenLabsServer(ElevenLabsOptions(chunk_ms=100, pace=1.0))
    chat = FakeChatServer([ScriptedReply(text=reply, token_s=0.01), ScriptedReply(text="Sure.")])
    async with deepgram, eleven, chat:
        gateway = await start_gateway(
            peer_procs,
            env={
                "GATEWAY_PROVIDER": "pipeline",
                "GATEWAY_LLM_URL": chat.url,
                "GATEWAY_PIPELINE_URLS": f"deepgram={deepgram.base_url},elevenlabs={eleven.base_url}",
                "GATEWAY_CONFIG": str(_cloud_config(tmp_path / "gateway.toml")),
                "OPENAI_API_KEY": "",
                "DEEPGRAM_API_KEY": "",
                "ELEVENLABS_API_KEY": "",
            },
        )
        source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.8, TURN_C, 2.0])
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            await phone.wait_closed(within=40)
        await session_counters(gateway)
        requests = chat.requests
        assert len(requests) == 2, [r.messages for r in requests]
        jobs = [m["text"] for m in eleven.record(1).received if m.get("flush") and m.get("text", "").strip()]

    (cut,) = barge_in_lines(gateway)
    ((_item_id, (sent_ms, received_ms)),) = cut.items.items()
    heard = expected_cloud_heard(jobs, min(sent_ms, received_ms))
    assert heard and heard != reply, (heard, sent_ms, received_ms, jobs)
    assert requests[1].messages[1:] == [
        {"role": "user", "content": "check my order"},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "stop please"},
    ], json.dumps(requests[1].messages, indent=1)
    call = await only_call(gateway)
    lines = [(line["role"], line["text"]) for line in call["transcript"] if line["text"]]
    assert lines[:3] == [("user", "check my order"), ("assistant", heard), ("user", "stop please")]


def expected_cloud_heard(jobs: list[str], audio_end_ms: int) -> str:
    """What the ElevenLabs fake was asked to say, flush by flush, laid out by its documented speech model (a 30 ms
    lead before the first text only); a word counts as heard once its sound started before ``audio_end_ms``."""
    text, cut, offset = "", 0, 0
    for index, job in enumerate(jobs):
        words, total_ms = speech.layout(job, lead_ms=speech.LEAD_MS if index == 0 else 0)
        for word in words:
            if offset + word.start_ms < audio_end_ms:
                cut = len(text) + word.char_end
        text += job
        offset += total_ms
    return text[:cut].strip()
