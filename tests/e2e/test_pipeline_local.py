"""The local pipeline end to end, no keys and no network: a baresip phone calls ``gateway run`` on a route whose
profile is the local stack (silero VAD, Whisper tiny.en, the rule agent, espeak-ng).

What must hold: the caller's spoken order number is heard and answered aloud (baresip's recording, transcribed by
the same local Whisper, holds the agent's read-back), and the caller's spoken goodbye ends the call through the
rule agent's ``hang_up`` tool call: the gateway hangs up before the phone's audio ends, and the call record says
``agent_hang_up``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gateway.providers.pipeline.local.rules import digits_in
from gateway.providers.pipeline.local.whisper import WhisperConfig, shared_whisper
from tests.e2e.gateway_proc import start_gateway
from tests.e2e.provider_harness import caller_wav, only_call
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import normalise, word_errors
from tests.support.audio import read_wav, resample
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(150)]

ORDER = "My order number is four five seven two."
GOODBYE = "Thank you very much, goodbye."
SPOKEN = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
FAREWELL = "Goodbye, thank you for calling."
TAIL_S = 20.0  # the phone's audio goes on this long after the goodbye: the agent must hang up first


def _spoken_pieces(pcm: np.ndarray, *, gap_s: float = 0.7) -> list[np.ndarray]:  # type: ignore[type-arg]
    """The stretches of 16 kHz audio above -45 dBFS, joined across pauses shorter than ``gap_s``, padded 0.2 s."""
    frames = pcm[: len(pcm) // 320 * 320].reshape(-1, 320).astype(np.float64)
    loud = np.sqrt((frames**2).mean(axis=1)) > 32768 * 10 ** (-45 / 20)
    pieces, start, last = [], None, -1000
    for i in np.flatnonzero(loud):
        if start is None:
            start = i
        elif (i - last) * 0.02 > gap_s:
            pieces.append((start, last))
            start = i
        last = i
    if start is not None:
        pieces.append((start, last))
    return [pcm[max(0, a * 320 - 3200) : (b + 1) * 320 + 3200] for a, b in pieces]


def _config(path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                "[[routes]]",
                'name = "all"',
                'did = "*"',
                'profile = "local"',
                "",
                "[profiles.local]",
                'provider = "pipeline"',
                'instructions = "You are the local test agent."',
                "",
                "[profiles.local.pipeline]",
                "endpoint_ms = 500",
                "max_endpoint_ms = 8000",  # a decode on a machine other jobs load can take seconds
                'stt = { name = "whisper" }',
                'llm = { name = "rules" }',
                'tts = { name = "espeak" }',
                'vad = { name = "silero" }',
            ]
        )
        + "\n"
    )
    return path


async def test_a_caller_is_answered_aloud_and_a_spoken_goodbye_hangs_up(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    require_local_extra()
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    gateway = await start_gateway(
        peer_procs,
        env={"GATEWAY_CONFIG": str(_config(tmp_path / "gateway.toml")), "HF_HUB_OFFLINE": "1"},
    )
    source = caller_wav(tmp_path / "caller.wav", [2.0, ORDER, 8.0, GOODBYE, TAIL_S])
    source_s = len(read_wav(source).samples) / 8000
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    loop = asyncio.get_running_loop()
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=20)
        established_at = loop.time()
        await phone.wait_closed(within=source_s + 10)
        lasted = loop.time() - established_at
    assert lasted < source_s - TAIL_S / 2, f"the call lasted {lasted:.1f} s: the phone's audio ended it, not the agent"

    call = await only_call(gateway)
    assert call["end_reason"] == "agent_hang_up", call
    lines = [(line["role"], line["text"]) for line in call["transcript"] if line["text"]]
    users = [text for role, text in lines if role == "user"]
    agent = [text for role, text in lines if role == "assistant"]
    assert len(users) == 2 and word_errors(ORDER, users[0]) <= 2 and word_errors(GOODBYE, users[1]) <= 1, lines
    # The read-back is of the digits the recogniser heard through the phone (it may miss one), and it was heard.
    digits = digits_in(users[0])
    assert len(digits) >= 3 and "".join(digits) in "4572", lines
    read_back = f"I heard {', '.join(SPOKEN[int(d)] for d in digits)}."
    # (A reply the core truncated after it had all played keeps its words, not always its final full stop.)
    assert [text.rstrip(".") for text in agent[-2:]] == [read_back.rstrip("."), FAREWELL.rstrip(".")], lines

    # What the phone heard: its recording, cut where the agent paused and transcribed by the local Whisper, holds
    # the agent's replies.
    heard = read_wav(phone.last_recording().decoded)
    pcm16k = np.clip(resample(heard.samples, heard.rate, 16000) * 32768, -32768, 32767).astype(np.int16)
    runtime = await shared_whisper(WhisperConfig())
    text = " ".join([await runtime.transcribe(piece) for piece in _spoken_pieces(pcm16k)])
    words = normalise(text)
    # The read-back's digits are the hardest part of an 8 kHz espeak voice for tiny.en ("for", dropped "seven"):
    # the words around them must be there, in order, and most words overall.
    assert words[:2] == ["i", "heard"] and words[-4:] == ["thank", "you", "for", "calling"], text
    expected = f"{read_back} {FAREWELL}"
    assert word_errors(expected, text) <= len(normalise(expected)) * 0.4, text
