"""The fake OpenAI Realtime server itself: HTTP control, records, faults, the CLI, many connections."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import socket
import sys
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.providers import fake_audio
from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
from telcodecs.frames import dbfs
from tests.gateway.providers.helpers import noise_frames, silent_frames

pytestmark = pytest.mark.timeout(60)


def _append(frame: bytes) -> str:
    return orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()}).decode()


async def _recv_until(ws: Any, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            event = orjson.loads(await ws.recv())
            if event["type"] == kind:
                return event


async def test_http_records_and_control() -> None:
    async with FakeRealtimeServer() as fake, connect(fake.url + "?tag=a", proxy=None) as ws:
        await _recv_until(ws, "session.created")
        frames = noise_frames(3, seed=9)
        for frame in frames:
            await ws.send(_append(frame))
        await fake.wait_until(lambda: fake.record(1).audio_bytes == 3 * 960)
        base = f"http://127.0.0.1:{fake.port}"
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=5) as http:
            health = await http.get("/healthz")
            assert health.json() == {"ok": True, "live": 1}
            assert health.headers["connection"] == "close"  # the server closes after answering: it says so
            (summary,) = (await http.get("/records")).json()
            assert summary["audio_bytes"] == 3 * 960
            assert summary["audio_sha256"] == hashlib.sha256(b"".join(frames)).hexdigest()
            detail = (await http.get("/records/1")).json()
            assert [e["type"] for e in detail["event_list"]] == ["input_audio_buffer.append"] * 3
            assert detail["path"] == "/v1/realtime?tag=a"
            reply = await http.get("/control/1", params={"action": "error", "code": "boom", "message": "m"})
            assert reply.status_code == 200
            error = await _recv_until(ws, "error")
            assert (error["error"]["code"], error["error"]["message"]) == ("boom", "m")
            assert (await http.get("/control/1", params={"action": "nope"})).status_code == 400
            assert (await http.get("/control/99", params={"action": "drop"})).status_code == 404
            assert (await http.get("/elsewhere")).status_code == 404
            await http.get("/control/1", params={"action": "drop"})
        with pytest.raises(ConnectionClosed) as closed:
            await _recv_until(ws, "never")
        assert closed.value.rcvd is None  # no close frame: the TCP connection just vanished


async def test_meta_records_keep_hash_not_audio() -> None:
    async with FakeRealtimeServer(FakeOptions(record="meta")) as fake, connect(fake.url, proxy=None) as ws:
        frames = noise_frames(4, seed=1)
        for frame in frames:
            await ws.send(_append(frame))
        await fake.wait_until(lambda: fake.record(1).audio_bytes == 4 * 960)
        record = fake.record(1)
        assert record.audio == bytearray()
        assert record.events == [{"type": "input_audio_buffer.append", "audio_bytes": 960}] * 4
        assert record.audio_sha256.hexdigest() == hashlib.sha256(b"".join(frames)).hexdigest()


async def test_bad_query_and_beta_header_are_refused() -> None:
    async with FakeRealtimeServer() as fake:
        async with connect(fake.url + "?mode=karaoke", proxy=None) as ws:
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert ws.close_code == 1008
        async with connect(fake.url, additional_headers={"OpenAI-Beta": "realtime=v1"}, proxy=None) as ws:
            error = await _recv_until(ws, "error")
            assert error["error"]["code"] == "beta_protocol_removed"
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert ws.close_code == 4000


async def test_drop_after_seconds_and_reply_delay() -> None:
    options = FakeOptions(drop_after_s=0.3, reply_delay_s=0.1, mode="tone", reply_ms=100)
    async with FakeRealtimeServer(options) as fake, connect(fake.url, proxy=None) as ws:
        loop = asyncio.get_running_loop()
        await ws.send('{"type":"response.create"}')
        asked = loop.time()
        await _recv_until(ws, "response.created")
        assert loop.time() - asked >= 0.1
        with pytest.raises(ConnectionClosed) as closed:
            await _recv_until(ws, "never")
        assert closed.value.rcvd is None
        await fake.wait_until(lambda: fake.record(1).ended_at is not None)


async def test_vad_positions_follow_the_audio() -> None:
    async with FakeRealtimeServer() as fake, connect(fake.url, proxy=None) as ws:
        for frame in silent_frames(7) + noise_frames(3, seed=4) + silent_frames(30):
            await ws.send(_append(frame))
        started = await _recv_until(ws, "input_audio_buffer.speech_started")
        stopped = await _recv_until(ws, "input_audio_buffer.speech_stopped")
        assert started["audio_start_ms"] == 140
        assert stopped["audio_end_ms"] == 200 + 500  # default silence window 500 ms
        assert started["item_id"] == stopped["item_id"]
        del fake


@given(cuts=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=30))
def test_the_vad_decides_the_same_however_the_audio_is_cut(cuts: list[int]) -> None:
    audio = b"".join(silent_frames(7) + noise_frames(3, seed=4) + silent_frames(30) + noise_frames(2, seed=5))
    whole = fake_audio.EnergyVad("audio/pcm").feed(audio)
    assert [(d.kind, d.ms) for d in whole] == [("started", 140), ("stopped", 700), ("started", 800)]
    vad = fake_audio.EnergyVad("audio/pcm")
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(audio[start : start + cut])
        start += cut
    pieces.append(audio[start:])
    assert [d for piece in pieces for d in vad.feed(piece)] == whole


@pytest.mark.parametrize("fmt", ["audio/pcm", "audio/pcmu", "audio/pcma"])
def test_a_frame_is_loud_when_its_rms_in_dbfs_is_over_the_threshold(fmt: fake_audio.AudioFormat) -> None:
    """Alone (a 20 ms append) or in a batch (a quiet caller's 100 ms append), each frame is judged as
    telcodecs.frames.dbfs would judge it, at levels from well under to well over the threshold."""
    rate = fake_audio.sample_rate(fmt)
    n = rate // 50
    levels = [0.0, 10.0, 50.0, 150.0, 180.0, 190.0, 200.0, 250.0, 3000.0]  # -45 dBFS is an RMS of about 184
    rng = np.random.default_rng(7)
    pcm = [(rng.standard_normal(n) * level).astype(np.int16) for level in levels]
    coded = [fake_audio.encode(fmt, frame) for frame in pcm]
    expected = [dbfs(fake_audio.decode(fmt, frame)) > -45.0 for frame in coded]
    assert expected[:3] == [False] * 3 and expected[-2:] == [True] * 2  # the levels straddle the threshold
    vad = fake_audio.EnergyVad(fmt, threshold_dbfs=-45.0)
    assert [vad._loud(memoryview(frame))[0] for frame in coded] == expected
    assert vad._loud(memoryview(b"".join(coded))) == expected
    silent = fake_audio.encode(fmt, np.zeros(n, dtype=np.int16))
    assert vad._loud(memoryview(silent * 3)) == [False] * 3


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_cli_runs_and_stops_on_sigterm(loop: str) -> None:
    async def scenario() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "fake-provider",
            "--port",
            "0",
            "--mode",
            "tone",
            "--reply-ms",
            "200",
            *(["--no-uvloop"] if loop == "asyncio" else []),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            async with asyncio.timeout(20):
                assert proc.stdout is not None
                line = (await proc.stdout.readline()).decode().strip()
                assert line.startswith("listening ws://127.0.0.1:")
                url = line.split()[1]
                async with connect(url, proxy=None) as ws:
                    await _recv_until(ws, "session.created")
                    await ws.send('{"type":"response.create"}')
                    done = await _recv_until(ws, "response.done")
                    assert done["response"]["status"] == "completed"
                os.kill(proc.pid, signal.SIGTERM)
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()

    asyncio.run(scenario())


async def test_hundreds_of_concurrent_connections() -> None:
    turn = silent_frames(2) + noise_frames(5, seed=8) + silent_frames(26)
    messages = [_append(frame) for frame in turn]

    async def call(url: str) -> int:
        async with connect(url, proxy=None, compression=None) as ws:
            for message in messages:
                await ws.send(message)
            done = await _recv_until(ws, "response.done")
            assert done["response"]["status"] == "completed"
            return 1

    async with FakeRealtimeServer(FakeOptions(record="meta")) as fake:
        async with asyncio.timeout(30):
            results = await asyncio.gather(*(call(fake.url) for _ in range(200)))
        assert sum(results) == 200
        assert all(r.audio_bytes == len(turn) * 960 for r in fake.records.values())


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT on this platform")
async def test_fakes_that_reuse_one_port_share_its_connections() -> None:
    # What `gateway bench calls --fakes N` relies on: N fake processes on one port, one URL for the worker.
    meta = FakeOptions(record="meta")
    async with (
        FakeRealtimeServer(meta, reuse_port=True) as first,
        FakeRealtimeServer(meta, port=first.port, reuse_port=True) as second,
    ):
        assert second.url == first.url

        async def session() -> None:
            async with connect(first.url, proxy=None) as ws:
                await _recv_until(ws, "session.created")

        async with asyncio.timeout(20):
            await asyncio.gather(*(session() for _ in range(40)))
        # The kernel spreads connections by their addresses: each fake has had some (40 on one: 2 ** -39).
        assert len(first.records) + len(second.records) == 40
        assert len(first.records) > 0 and len(second.records) > 0


@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=64))
def test_g711_encode_inverts_decode(samples: list[int]) -> None:
    pcm = np.array(samples, dtype=np.int16)
    for fmt in ("audio/pcmu", "audio/pcma"):
        decoded = fake_audio.decode(fmt, fake_audio.encode(fmt, pcm))  # type: ignore[arg-type]
        again = fake_audio.encode(fmt, decoded)  # type: ignore[arg-type]
        assert again == fake_audio.encode(fmt, pcm)  # type: ignore[arg-type]
        # G.711 quantisation error stays within half a step of the largest segment (μ-law 4096, A-law 2048 wide).
        assert np.max(np.abs(decoded.astype(np.int32) - pcm)) <= 1024 + 8


def test_g711_tables_match_reference_points() -> None:
    ulaw = fake_audio.decode("audio/pcmu", bytes([0x00, 0x7F, 0x80, 0xFF]))
    assert ulaw.tolist() == [-32124, 0, 32124, 0]
    alaw = fake_audio.decode("audio/pcma", bytes([0xD5, 0x55, 0xAA, 0x2A]))
    assert alaw.tolist() == [8, -8, 32256, -32256]
