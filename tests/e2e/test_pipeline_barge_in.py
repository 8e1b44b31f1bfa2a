"""The cascaded pipeline end to end: a baresip phone calls ``gateway run`` whose provider is ``pipeline`` (scripted
recogniser, the fake Chat Completions server over HTTP, the synthetic voice with exact word timings), and talks
over the agent.

What must hold: the caller's barge-in stops the agent, and the NEXT Chat Completions request holds exactly the
words whose audio started before the milliseconds the gateway sent to the phone, and the call's own transcript
(ops API) holds that same prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
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
