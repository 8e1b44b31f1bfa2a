"""A split deployment as users run it: Kamailio dispatching SIP to two ``gateway worker`` processes, which
register with two ``gateway control`` processes sharing one redis-server.

Proven here with real processes and real phones: both workers register and take calls through the
balancer and echo them; a drained worker refuses new calls (503, so Kamailio's failure_route offers them to
the other worker) while its call in progress goes on to the end; a killed worker is marked lost and its
calls are reported ended with ``worker_lost``; and whatever one control-plane process learnt (calls, workers,
events with their ids) is served identically by the other.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.ops_support import EventStream, SseEvent, metric_value, poll
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.kamailio import KamailioDispatcher
from tests.support.peers import require_binary
from tests.support.procs import ManagedProcess, ProcessGroup, free_ports
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

TOKEN = "cluster-token-0123456789"
CONFIG = """
[fleet]
heartbeat_interval_s = 1.0
lost_after_missed = 3
sse_keepalive_s = 2

[[routes]]
name = "agents"
did = "*"
profile = "echo"

[profiles.echo]
provider = "echo"
"""
_RTP_BLOCKS = itertools.count()


@dataclass
class Plane:
    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10.0)


@dataclass
class Worker:
    process: ManagedProcess
    id: str
    sip_port: int
    api_port: int

    @property
    def sip_target(self) -> str:
        return f"sip:127.0.0.1:{self.sip_port}"


def _env(**extra: str) -> dict[str, str]:
    return {"GATEWAY_API_TOKEN": TOKEN, "GATEWAY_PROVIDER": "echo", "PYTHONUNBUFFERED": "1", **extra}


async def start_control(procs: ProcessGroup, name: str, *, config: Path, redis_url: str) -> Plane:
    port = free_ports(1)[0]
    env = _env(GATEWAY_HTTP_PORT=str(port), GATEWAY_CONFIG=str(config), GATEWAY_REDIS_URL=redis_url)
    process = await procs.start(name, [sys.executable, "-m", "gateway", "control"], env=env, lifetime=150)
    await process.wait_for_port(port, within=30)
    return Plane(process=process, port=port)


async def start_worker(procs: ProcessGroup, worker_id: str, *, control: Plane) -> Worker:
    sip_port, api_port = free_ports(2)
    rtp_low = 34000 + (next(_RTP_BLOCKS) % 20) * 100  # above the harness's peer ports, below the ephemeral ones
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "worker",
        "--control",
        control.url,
        "--worker-id",
        worker_id,
        "--sip-port",
        str(sip_port),
        "--api-port",
        str(api_port),
        "--rtp-ports",
        f"{rtp_low}-{rtp_low + 99}",
    ]
    process = await procs.start(worker_id, argv, env=_env(), lifetime=150)
    await process.wait_for_output(rf"worker {worker_id}: SIP on 127\.0\.0\.1:{sip_port}", within=30)
    await process.wait_for_port(api_port, within=10)
    return Worker(process=process, id=worker_id, sip_port=sip_port, api_port=api_port)


async def _live_calls(plane: httpx.AsyncClient, count: int, **filters: str) -> list[dict[str, Any]] | None:
    items: list[dict[str, Any]] = (await plane.get("/v1/calls", params={"state": "active", **filters})).json()["items"]
    return items if len(items) == count else None


def _by_caller(calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {call["from"]: call for call in calls}


def _heard_own_speech(phone: BaresipPhone, speech: Path, nth: int = 0) -> float:
    sent = read_wav(speech)
    heard = read_wav(phone.recordings()[nth].decoded)
    # Under CPU pressure a jitter buffer (ours or baresip's) may shift the delay by a frame or two mid-call
    # without losing audio: allow that much slip between windows.
    correlation, _ = align_and_correlate(sent.samples, heard.samples, sent.rate, max_slip_seconds=0.15)
    return correlation


async def test_kamailio_two_workers_two_control_planes_drain_and_loss(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    for binary, package in (("baresip", "baresip baresip-core"), ("kamailio", None), ("kamcmd", "kamailio")):
        require_binary(binary, package=package)
    require_binary("redis-server", package="redis-server")
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)

    redis = await RedisServer(peer_procs, tmp_path, lifetime=150).start()
    plane_a, plane_b = await asyncio.gather(
        start_control(peer_procs, "control-a", config=config, redis_url=redis.url),
        start_control(peer_procs, "control-b", config=config, redis_url=redis.url),
    )
    async with (
        plane_a.client() as api_a,
        plane_b.client() as api_b,
        EventStream(plane_a.url, TOKEN, last_event_id=0, name="sse-a") as events_a,
        EventStream(plane_b.url, TOKEN, last_event_id=0, name="sse-b") as events_b,
    ):
        # Each worker registers with its own control-plane process; both planes see both workers.
        worker_a, worker_b = await asyncio.gather(
            start_worker(peer_procs, "w-a", control=plane_a), start_worker(peer_procs, "w-b", control=plane_b)
        )
        workers = {worker_a.id: worker_a, worker_b.id: worker_b}
        for api in (api_a, api_b):
            listed = (await api.get("/v1/workers")).json()["items"]
            assert {(w["id"], w["status"], w["url"]) for w in listed} == {
                ("w-a", "up", f"http://127.0.0.1:{worker_a.api_port}"),
                ("w-b", "up", f"http://127.0.0.1:{worker_b.api_port}"),
            }
        assert (await api_b.get("/readyz")).json()["workers_up"] == 2

        lb = KamailioDispatcher(peer_procs, tmp_path, workers=[worker_a.sip_target, worker_b.sip_target], lifetime=150)
        await lb.start()
        for worker in workers.values():
            await lb.wait_target(worker.sip_target, active=True, within=10)  # our OPTIONS answers count

        # 1. Two callers through the balancer land on the two workers and hear themselves.
        brief = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="brief", user="brief", tail_silence=1.5)
        held = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="held", user="held", tail_silence=11)
        late = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="late", user="late", tail_silence=16)
        phones = (brief, held, late)
        await asyncio.gather(*(phone.start() for phone in phones))
        try:
            await brief.dial(lb.sip_uri("agent"))
            await held.dial(lb.sip_uri("agent"))
            await brief.wait_established(within=10)
            await held.wait_established(within=10)
            first = _by_caller(await poll(lambda: _live_calls(api_b, 2), within=10, what="two live calls"))
            assert {first["brief"]["worker"], first["held"]["worker"]} == {"w-a", "w-b"}, first
            drained = workers[first["held"]["worker"]]
            other = workers[first["brief"]["worker"]]
            held_call = first["held"]["id"]
            # The call is served identically by both control-plane processes (shared Redis state).
            via_a = (await api_a.get(f"/v1/calls/{held_call}")).json()
            assert via_a["worker"] == drained.id and via_a["state"] == "active" and via_a["route"] == "agents"
            await brief.wait_closed(within=15)
            assert _heard_own_speech(brief, speech_8k) >= 0.9

            # 2. Drain the held call's worker (through the plane it did not register with).
            response = await api_a.post(f"/v1/workers/{drained.id}/drain", json={"exit_when_empty": False})
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "draining"
            assert (await api_b.get("/readyz")).json()["workers_up"] == 1
            await events_b.wait_for(
                lambda e: e.type == "worker.draining" and e.subject["id"] == drained.id, within=5, what="draining"
            )
            # Two new calls: round robin offers one of them to the draining worker, which answers 503;
            # the failure route moves it to the other worker. Both land there.
            await brief.dial(lb.sip_uri("agent"))
            await late.dial(lb.sip_uri("agent"))
            await brief.wait_established(within=10, nth=2)
            await late.wait_established(within=10)
            moved = _by_caller(
                await poll(lambda: _live_calls(api_a, 2, worker=other.id), within=10, what="two calls on the other")
            )
            assert set(moved) == {"brief", "late"}
            assert lb.process is not None
            await lb.process.wait_for_output(
                rf"worker {drained.sip_target} failed \(503\) for INVITE: marking it down", within=5
            )
            # The refused attempt is no call of the fleet (it was never admitted): only the held call is there.
            still = (await api_b.get("/v1/calls", params={"worker": drained.id})).json()["items"]
            assert [(call["id"], call["state"]) for call in still] == [(held_call, "active")]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{drained.api_port}", timeout=5) as direct:
                assert (await direct.get("/metrics")).status_code == 401
                metrics = (await direct.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
            labels = {"worker": drained.id, "end_reason": "rejected_draining"}
            assert metric_value(metrics, "gateway_calls_total", labels) == 1.0
            assert metric_value(metrics, "gateway_active_calls", {"worker": drained.id}) == 1.0

            # 3. Kill the other worker outright: it is marked lost and its calls end with worker_lost.
            os.kill(other.process.pid, signal.SIGKILL)
            lost = await events_b.wait_for(
                lambda e: e.type == "worker.lost" and e.subject["id"] == other.id, within=10, what="worker.lost"
            )
            for call in moved.values():
                ended = await events_b.wait_for(
                    _ended(call["id"]), within=5, what=f"call.ended of {call['from']} on the lost worker"
                )
                assert ended.subject["end_reason"] == "worker_lost"
                assert ended.id is not None and lost.id is not None and ended.id > lost.id
            gone = (await api_a.get(f"/v1/workers/{other.id}")).json()
            assert gone["status"] == "lost"
            assert (await api_a.get("/v1/calls", params={"worker": other.id, "live": "true"})).json()["items"] == []

            # 4. The drained worker's call went on to its end; the caller heard itself all along.
            await held.wait_closed(within=25)
            held_end = await events_a.wait_for(_ended(held_call), within=5, what="call.ended of the held call")
            assert held_end.subject["end_reason"] == "caller_hangup" and held_end.subject["worker"] == drained.id
            assert _heard_own_speech(held, speech_8k) >= 0.9
            assert (await api_b.get(f"/v1/workers/{drained.id}")).json()["status"] == "draining"

            # 5. An orderly stop (SIGTERM) exits 0 and is reported as gone, not lost.
            assert await drained.process.terminate(grace=10) == 0
            await events_a.wait_for(
                lambda e: e.type == "worker.gone" and e.subject["id"] == drained.id, within=5, what="worker.gone"
            )
            assert (await api_a.get(f"/v1/workers/{drained.id}")).json()["status"] == "gone"
            assert (await api_a.get("/readyz")).status_code == 503
        finally:
            await asyncio.gather(*(phone.aclose() for phone in phones))

        # Both planes streamed the same events under the same ids (one ring in Redis).
        common = min(len(events_a.events), len(events_b.events))
        assert common > 10
        assert [(e.id, e.type) for e in events_a.events[:common]] == [(e.id, e.type) for e in events_b.events[:common]]


def _ended(call_id: str) -> Any:
    def match(event: SseEvent) -> bool:
        return event.type == "call.ended" and event.call_id == call_id

    return match
