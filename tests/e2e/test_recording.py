"""Recorded calls with real peers: a baresip phone calls the echo agent on a route with ``record = "both"``.

1. ``gateway run``: the call ends and its record holds a recording, served by ``GET /v1/calls/{id}/recording``
   (with Range requests), whose left channel is what baresip sent and whose right channel what it heard from
   the agent (correlation >= 0.9 each).
2. ``gateway control`` + ``gateway worker`` as separate processes sharing the recordings directory: the worker
   is killed (SIGKILL) mid-call; the plane ends the call ``worker_lost``, its record names the recording, and the
   file the worker left plays (soundfile, PyAV) up to its last seconds.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import soundfile

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import poll
from tests.support.audio import align_and_correlate, read_wav, resample, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.postgres import PostgresServer
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

CONFIG = """
[fleet]
heartbeat_interval_s = 0.5
lost_after_missed = 4

[[routes]]
name = "recorded"
did = "*"
profile = "echo"
record = "both"

[profiles.echo]
provider = "default"
"""


async def _ended_record(gateway: GatewayProcess) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        page = await gateway.api("GET", "/v1/calls", params={"live": "false"})
        if not page["items"]:
            return None
        record: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{page['items'][0]['id']}")
        return record if record.get("recording") and record["recording"]["bytes"] else None

    record: dict[str, Any] = await poll(ended, within=15, what="the recorded call's record")
    return record


@pytest.fixture(params=["sqlite", "postgresql"])
def database_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The record of the recorded call in each engine of the database of calls."""
    if request.param == "sqlite":
        yield {}
        return
    with PostgresServer(name="e2e-recording") as postgres:
        yield {"GATEWAY_DATABASE_URL": postgres.create_database("calls")}


async def test_a_recorded_call_holds_both_sides_on_their_channels(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path, database_env: dict[str, str]
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    config = tmp_path / "routes.toml"
    config.write_text(CONFIG)
    gateway = await start_gateway(peer_procs, env={"GATEWAY_CONFIG": str(config), **database_env})
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.5)
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=40)
    record = await _ended_record(gateway)
    stats = record["stats"]  # the quality figures kept beside the recording
    assert stats["rtp_packets_in"] > 100 and stats["mos"] > 3.5 and stats["jitter_ms"] is not None, stats
    recording = record["recording"]
    assert recording["format"] == "wav" and recording["channels"] == 2 and recording["sample_rate"] == 16_000
    assert recording["path"].endswith(f"{record['id']}.wav") and record["recording_path"] == recording["path"]

    async with gateway.client() as client:
        whole = await client.get(f"/v1/calls/{record['id']}/recording")
        assert whole.status_code == 200 and whole.headers["content-type"] == "audio/wav"
        assert len(whole.content) == recording["bytes"]
        part = await client.get(f"/v1/calls/{record['id']}/recording", headers={"Range": "bytes=44-1043"})
        assert part.status_code == 206 and part.content == whole.content[44:1044]
        assert part.headers["content-range"] == f"bytes 44-1043/{recording['bytes']}"
        outside = await client.get(f"/v1/calls/{record['id']}/recording", headers={"Range": "bytes=99999999-"})
        assert outside.status_code == 416
        absent = await client.get("/v1/calls/c-nope/recording")
        assert absent.status_code == 404
        anonymous = await client.get(f"/v1/calls/{record['id']}/recording", headers={"Authorization": ""})
        assert anonymous.status_code == 401

    data, rate = soundfile.read(io.BytesIO(whole.content), dtype="int16")
    assert rate == 16_000 and data.shape[1] == 2
    assert recording["duration_s"] == pytest.approx(len(data) / rate, abs=0.01)
    sent = read_wav(speech_8k)
    heard = read_wav(phone.last_recording().decoded)
    left, _ = align_and_correlate(resample(sent.samples, sent.rate, rate), data[:, 0], rate, max_slip_seconds=0.25)
    right, _ = align_and_correlate(resample(heard.samples, heard.rate, rate), data[:, 1], rate, max_slip_seconds=0.25)
    assert left >= 0.9, f"caller channel correlation {left:.3f}"
    assert right >= 0.9, f"agent channel correlation {right:.3f}"


async def test_a_worker_killed_mid_call_leaves_a_playable_recording(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    config = tmp_path / "routes.toml"
    config.write_text(CONFIG)
    recordings = tmp_path / "recordings"  # one directory for both processes, as on one host or a shared volume
    sent = read_wav(speech_8k)
    long_source = write_wav(tmp_path / "long.wav", np.tile(sent.samples, (6, 1)), sent.rate)
    http_port, sip_port, api_port = free_ports(3)
    token = "test-token-0123456789"
    env = {
        "GATEWAY_API_TOKEN": token,
        "GATEWAY_PROVIDER": "echo",
        "GATEWAY_RECORDINGS_DIR": str(recordings),
        "PYTHONUNBUFFERED": "1",
    }
    control_env = {
        **env,
        "GATEWAY_HTTP_PORT": str(http_port),
        "GATEWAY_CONFIG": str(config),
        "GATEWAY_STATE_DIR": str(tmp_path / "state"),
    }
    control = await peer_procs.start(
        "control", [sys.executable, "-m", "gateway", "control"], env=control_env, lifetime=170
    )
    await control.wait_for_port(http_port, within=30)
    plane = GatewayProcess(
        process=control, sip_port=sip_port, http_port=http_port, token=token, rtp_range=(0, 0), env=control_env
    )
    argv = [sys.executable, "-m", "gateway", "worker", "--control", plane.http, "--worker-id", "w-rec"]
    argv += ["--sip-port", str(sip_port), "--api-port", str(api_port), "--rtp-ports", "35000-35099"]
    worker_env = {**env, "GATEWAY_STATE_DIR": str(tmp_path / "w-state")}
    worker = await peer_procs.start("worker", argv, env=worker_env, lifetime=170)
    await worker.wait_for_output(rf"worker w-rec: SIP on 127\.0\.0\.1:{sip_port}", within=30)

    phone = BaresipPhone(peer_procs, tmp_path, source_wav=long_source, codecs=("pcmu",), lifetime=120)
    async with phone:
        await phone.dial(f"sip:agent@127.0.0.1:{sip_port}")
        await phone.wait_established(within=15)

        async def live() -> dict[str, Any] | None:
            page = await plane.api("GET", "/v1/calls", params={"live": "true"})
            items = [call for call in page["items"] if call.get("recording")]
            return items[0] if items else None

        call = await poll(live, within=15, what="the live call with its recording")
        path = recordings / call["recording"]["path"]

        # 3 s of 16 kHz stereo PCM16 on disk: the writer flushes while the call runs
        async def on_disk() -> bool:
            return path.exists() and path.stat().st_size > 3 * 64_000

        await poll(on_disk, within=20, what="3 s on disk")
        os.kill(worker.pid, signal.SIGKILL)

        async def ended() -> dict[str, Any] | None:
            record: dict[str, Any] = await plane.api("GET", f"/v1/calls/{call['id']}")
            return record if record["state"] == "ended" else None

        record = await poll(ended, within=20, what="the call ended by the plane")
    assert record["end_reason"] == "worker_lost"
    assert record["recording"]["path"] == call["recording"]["path"]
    data, rate = soundfile.read(path, dtype="int16")
    assert rate == 16_000 and data.shape[1] == 2 and len(data) >= 3 * rate
    with av.open(str(path)) as container:
        decoded = sum(frame.samples for frame in container.decode(audio=0))
    assert decoded == len(data)
    # what the caller sent up to a second before the cut is in its channel
    kept = min(len(sent.samples), (len(data) // rate - 1) * sent.rate)
    source = resample(sent.samples[:kept], sent.rate, rate)
    caller, _ = align_and_correlate(source, data[:, 0], rate, max_slip_seconds=0.25)
    assert caller >= 0.9, f"the caller's channel of the cut recording: correlation {caller:.3f}"
    async with plane.client() as client:
        served = await client.get(f"/v1/calls/{call['id']}/recording")
    assert served.status_code == 200 and served.content[:4] == b"RIFF"
