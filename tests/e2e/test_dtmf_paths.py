"""DTMF both ways on a call without telephone-event, with a real phone (pjsua2, PJSIP's Python binding).

The gateway runs with ``GATEWAY_TELEPHONE_EVENT=false``, so the call negotiates no RFC 4733 events although the
phone offers them. Digits sent with ``POST /v1/calls/{id}/dtmf`` reach the phone as SIP INFO (its Allow lists
INFO), and the keys the phone plays as tones in its audio reach the call record's DTMF through the in-band
detector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from telcodecs.dtmf import tone
from tests.e2e.gateway_proc import start_gateway
from tests.e2e.ops_support import poll
from tests.support.audio import write_wav
from tests.support.peers import require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(60)]

PLAYED = "38#"


def _keys_wav(path: Path) -> Path:
    """One second of silence, the three keys (120 ms each, 150 ms apart), then silence to five seconds."""
    gap = np.zeros(1200, np.int16)
    parts = [np.zeros(8000, np.int16)]
    for digit in PLAYED:
        parts += [tone(digit, duration_ms=120, sample_rate=8000, level_dbfs=-12.0), gap]
    pcm = np.concatenate(parts)
    return write_wav(path, np.concatenate([pcm, np.zeros(40000 - pcm.size, np.int16)]), 8000)


async def _ended(client: Any, call_id: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await client.get(f"/v1/calls/{call_id}")).json()
    return call if call.get("state") == "ended" and call.get("dtmf_events") else None


async def test_dtmf_without_telephone_event_goes_as_info_out_and_tones_in(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_TELEPHONE_EVENT": "false"})
    phone = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=_keys_wav(tmp_path / "keys.wav"),
        hangup_after=6.0,
        record=False,
    )
    async with phone, gateway.client() as client:
        await phone.wait_state("CONFIRMED", within=20)
        live = await poll(lambda: _only_active(client), within=10, what="the phone's call listed as active")
        response = await client.post(f"/v1/calls/{live['id']}/dtmf", json={"digits": "47"})
        assert response.status_code == 204, response.text
        await phone.wait_event("dtmf_received", nth=2, within=10)
        assert phone.received_dtmf() == "47"
        await phone.wait_state("DISCONNECTED", within=15)
        ended = await poll(lambda: _ended(client, live["id"]), within=15, what="the ended call's record")
    assert ended["dtmf"] == PLAYED
    sent = [(e["digit"], e.get("method")) for e in ended["dtmf_events"] if e["direction"] == "sent"]
    assert sent == [("4", "info"), ("7", "info")]


async def _only_active(client: Any) -> dict[str, Any] | None:
    items = (await client.get("/v1/calls", params={"state": "active"})).json()["items"]
    return items[0] if len(items) == 1 else None
