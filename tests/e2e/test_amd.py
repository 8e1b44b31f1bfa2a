"""Answering-machine detection on a real outbound call: ``POST /v1/calls`` with ``amd=detect`` to an
auto-answering baresip that plays a case of the labelled set (bench/amd_set.py). A machine's greeting and beep:
the gateway hangs up ``machine_detected`` and the agent never heard the greeting. A person's "hello": the decision
is human, the agent greets and the call stays up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.amd_set import RATE, Case, build
from gateway.media.amd import AmdDecided, AnsweringMachineDetector
from tests.e2e.ops_support import poll
from tests.e2e.provider_harness import FakeProvider, start_fake_provider, start_gateway_on_fake
from tests.support.audio import read_wav, resample, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

GREETING = "Hello, this is Ada from the clinic."


def _classified(case: Case) -> str:
    pcm = read_wav(case.path).samples[:, 0].astype(np.int16)
    detector = AnsweringMachineDetector()
    for start in range(0, pcm.size - 480 + 1, 480):
        for event in detector.feed(pcm[start : start + 480]):
            if isinstance(event, AmdDecided):
                return event.result.value
    return "undecided"


def _pick(cases: list[Case], label: str) -> Case:
    """The first case labelled ``label`` that the detector also classifies so (the e2e tests the wiring)."""
    return next(case for case in cases if case.label == label and _classified(case) == label)


def _to_8k(case: Case, directory: Path) -> Path:
    samples = resample(read_wav(case.path).samples, RATE, 8000)  # float in [-1, 1]
    return write_wav(directory / f"{case.name}-8k.wav", samples, 8000)


async def _call(api: Any, to: str) -> str:
    response = await api.post("/v1/calls", json={"to": to, "caller_id": "+15550199", "amd": "detect"})
    assert response.status_code == 201, response.text
    call_id: str = response.json()["id"]
    return call_id


async def _with_amd(api: Any, call_id: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await api.get(f"/v1/calls/{call_id}")).json()
    return call if call.get("amd") is not None else None


async def _ended(api: Any, call_id: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await api.get(f"/v1/calls/{call_id}")).json()
    return call if call.get("state") == "ended" else None


def _creates(detail: dict[str, Any]) -> list[str]:
    return [
        (event.get("response") or {}).get("instructions", "")
        for event in detail["event_list"]
        if event["type"] == "response.create"
    ]


async def _connection_of(fake: FakeProvider, index: int) -> int:
    summaries = await fake.wait_for(lambda s: len(s) > index, within=15, what=f"connection {index + 1}")
    conn_id: int = summaries[index]["id"]
    return conn_id


async def test_amd_hangs_up_on_a_machine_and_lets_a_human_be_greeted(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_binary("espeak-ng", package="espeak-ng")
    cases = build(tmp_path / "amd-set", per_label=6)
    machine, human = _pick(cases, "machine"), _pick(cases, "human")
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "600")
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake, profile_lines=(f'greeting = "{GREETING}"',))
    voicemail = BaresipPhone(
        peer_procs,
        tmp_path,
        source_wav=_to_8k(machine, tmp_path),
        name="vm",
        user="vm",
        auto_answer=True,
        tail_silence=20,
    )
    person = BaresipPhone(
        peer_procs,
        tmp_path,
        source_wav=_to_8k(human, tmp_path),
        name="ann",
        user="ann",
        auto_answer=True,
        tail_silence=20,
    )
    async with gateway.client() as api, voicemail, person:
        # The machine: hung up by the gateway, machine_detected, and its greeting never reached the agent.
        started = time.monotonic()
        call_id = await _call(api, voicemail.sip_uri)
        await voicemail.wait_established(within=15)
        await voicemail.wait_closed(within=15)
        assert time.monotonic() - started < 12, "hung up on the decision, not when the WAV ran out"
        ended = await poll(lambda: _ended(api, call_id), within=10, what="the machine call ended")
        assert ended["end_reason"] == "machine_detected", ended
        assert ended["amd"]["result"] == "machine" and ended["amd"]["at_s"] > 0, ended
        conn = await _connection_of(fake, 0)
        assert _creates(await fake.record(conn)) == [], "no greeting to a machine"
        assert await fake.audio(conn) == b"", "the machine's greeting never reached the provider"

        # The person: human, the agent greets, the call stays up (hung up here by the API).
        call_id = await _call(api, person.sip_uri)
        await person.wait_established(within=15)
        live = await poll(lambda: _with_amd(api, call_id), within=15, what="the human call's AMD decision")
        assert live["amd"]["result"] == "human" and live["state"] == "active", live
        conn = await _connection_of(fake, 1)
        detail = await fake.wait_for_record(conn, lambda d: bool(_creates(d)), within=10, what="the greeting")
        assert _creates(detail) == [f"Greet the caller now, saying: {GREETING}"]
        assert (await api.post(f"/v1/calls/{call_id}/hangup")).status_code == 204
        await person.wait_closed(within=10)
        ended = await poll(lambda: _ended(api, call_id), within=10, what="the human call ended")
        assert ended["end_reason"] != "machine_detected" and ended["amd"]["result"] == "human", ended
