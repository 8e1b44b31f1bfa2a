"""A split deployment as users run it: Kamailio dispatching SIP to two ``gateway worker`` processes, which
register with two ``gateway control`` processes sharing one redis-server.

Proven here with real processes and real phones (baresip and pjsua2), in one story:
1. both workers register and take calls through the balancer and echo them; either control-plane process
   lists every call;
2. a control-plane process restarted mid-call loses nothing: the same workers, calls (the one in progress
   too, whose end it then reports) and event history, with the same event ids;
3. a worker killed mid-call (SIGKILL) is marked lost and its call reported ended with ``worker_lost``; the
   next call succeeds on the other worker;
4. the killed worker, started again under its id, is back in rotation;
5. a worker drained with ``gateway drain --wait`` (the preStop hook) refuses new calls (OPTIONS and INVITE
   503, so Kamailio sends them to the other worker) while its call in progress goes on to the end, after
   which the command returns 0; SIGTERM then stops it with status 0 and it is reported gone, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.ops_support import EventStream, SseEvent, poll
from tests.support.audio import align_and_correlate, read_wav, with_silence, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.kamailio import KamailioDispatcher
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ManagedProcess, ProcessGroup, free_ports
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300)]

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


async def start_control(
    procs: ProcessGroup, name: str, *, config: Path, redis_url: str, port: int | None = None
) -> Plane:
    port = port or free_ports(1)[0]
    # The planes of one fleet share its database of calls (a file here; PostgreSQL in production).
    records = f"sqlite:///{config.parent / 'calls.db'}"
    env = _env(GATEWAY_HTTP_PORT=str(port), GATEWAY_CONFIG=str(config), GATEWAY_REDIS_URL=redis_url)
    env["GATEWAY_DATABASE_URL"] = records
    process = await procs.start(name, [sys.executable, "-m", "gateway", "control"], env=env, lifetime=280)
    await process.wait_for_port(port, within=30)
    return Plane(process=process, port=port)


async def start_worker(
    procs: ProcessGroup,
    worker_id: str,
    *,
    control: Plane,
    fallback: Plane | None = None,
    ports: tuple[int, int] | None = None,
    name: str | None = None,
) -> Worker:
    sip_port, api_port = ports or free_ports(2)
    rtp_low = 34000 + (next(_RTP_BLOCKS) % 20) * 100  # above the harness's peer ports, below the ephemeral ones
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "worker",
        "--control",
        control.url if fallback is None else f"{control.url},{fallback.url}",
        "--worker-id",
        worker_id,
        "--sip-port",
        str(sip_port),
        "--api-port",
        str(api_port),
        "--rtp-ports",
        f"{rtp_low}-{rtp_low + 99}",
    ]
    process = await procs.start(name or worker_id, argv, env=_env(), lifetime=280)
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


async def test_two_workers_behind_kamailio_with_two_control_planes(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    for binary, package in (("baresip", "baresip baresip-core"), ("kamailio", None), ("kamcmd", "kamailio")):
        require_binary(binary, package=package)
    require_binary("redis-server", package="redis-server")
    require_module("pjsua2", package="pjsua2-python")
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)

    redis = await RedisServer(peer_procs, tmp_path, lifetime=280).start()
    plane_a, plane_b = await asyncio.gather(
        start_control(peer_procs, "control-a", config=config, redis_url=redis.url),
        start_control(peer_procs, "control-b", config=config, redis_url=redis.url),
    )
    async with contextlib.AsyncExitStack() as stack:
        api_a = await stack.enter_async_context(plane_a.client())
        api_b = await stack.enter_async_context(plane_b.client())
        events_a = await stack.enter_async_context(EventStream(plane_a.url, TOKEN, last_event_id=0, name="sse-a"))
        events_b = EventStream(plane_b.url, TOKEN, last_event_id=0, name="sse-b")
        await events_b.__aenter__()
        # Each worker registers with its own control-plane process, the other one its fallback; both planes see
        # both workers.
        worker_a, worker_b = await asyncio.gather(
            start_worker(peer_procs, "w-a", control=plane_a, fallback=plane_b),
            start_worker(peer_procs, "w-b", control=plane_b, fallback=plane_a),
        )
        workers = {worker_a.id: worker_a, worker_b.id: worker_b}
        for api in (api_a, api_b):
            assert await _worker_states(api) == {("w-a", "up"), ("w-b", "up")}
            listed = (await api.get("/v1/workers")).json()["items"]
            assert {w["id"]: w["url"] for w in listed} == {
                "w-a": f"http://127.0.0.1:{worker_a.api_port}",
                "w-b": f"http://127.0.0.1:{worker_b.api_port}",
            }
        assert (await api_b.get("/readyz")).json()["workers_up"] == 2

        lb = KamailioDispatcher(peer_procs, tmp_path, workers=[w.sip_target for w in workers.values()], lifetime=280)
        await lb.start()
        for worker in workers.values():
            await lb.wait_target(worker.sip_target, active=True, within=10)  # our OPTIONS answers count

        speech = read_wav(speech_8k)
        pj_wav = write_wav(tmp_path / "pj_speech.wav", with_silence(speech, tail=1.5).samples, speech.rate)
        brief = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="brief", user="brief", tail_silence=1.5)
        held = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="held", user="held", tail_silence=40)
        long = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="long", user="long", tail_silence=10)
        phones = (brief, held, long)
        await asyncio.gather(*(phone.start() for phone in phones))
        stack.push_async_callback(lambda: asyncio.gather(*(phone.aclose() for phone in phones)))

        # 1. A baresip and a pjsua2 caller through the balancer land one on each worker and hear themselves.
        await brief.dial(lb.sip_uri("agent"))
        await brief.wait_established(within=10)
        await poll(lambda: _live_calls(api_b, 1), within=10, what="the first call")
        pj = PjsuaPhone(
            peer_procs, tmp_path, mode="caller", uri=lb.sip_uri("agent"), user="pj", play=pj_wav, hangup_on_eof=True
        )
        async with pj:
            await pj.wait_state("CONFIRMED", within=15)
            first = _by_caller(await poll(lambda: _live_calls(api_b, 2), within=10, what="two live calls"))
            assert {first["brief"]["worker"], first["pj"]["worker"]} == {"w-a", "w-b"}, first
            for api in (api_a, api_b):  # either plane lists every call of the fleet
                assert set(_by_caller(await _live_calls(api, 2) or [])) == {"brief", "pj"}
            assert await pj.wait_done(within=30) == 0
        await brief.wait_closed(within=15)
        assert _heard_own_speech(brief, speech_8k) >= 0.9
        assert _correlation(speech, read_wav(pj.recording)) >= 0.9

        # 2. A call is up when control-b restarts: nothing it served is lost.
        await held.dial(lb.sip_uri("agent"))
        await held.wait_established(within=10)
        [held_call] = await poll(lambda: _live_calls(api_a, 1), within=10, what="the held call")
        before = await _plane_view(api_b)
        await events_b.aclose()
        assert await plane_b.process.terminate(grace=15) == 0
        plane_b = await start_control(peer_procs, "control-b2", config=config, redis_url=redis.url, port=plane_b.port)
        api_b = await stack.enter_async_context(plane_b.client())
        # While control-b was away, w-b heartbeated to control-a (its fallback), so it was never lost; the new
        # process serves the view served before the restart.
        await poll(lambda: _same_view(api_b, before), within=10, what="the restarted plane's view")
        events_b = await stack.enter_async_context(EventStream(plane_b.url, TOKEN, last_event_id=0, name="sse-b2"))
        await events_b.wait_for(lambda e: e.call_id == held_call["id"], within=5, what="the held call's events")
        assert not [e for e in events_a.events if e.type == "worker.lost"]
        common = min(len(events_a.events), len(events_b.events))
        assert common > 10
        assert [(e.id, e.type) for e in events_a.events[:common]] == [(e.id, e.type) for e in events_b.events[:common]]

        # 3. Kill the held call's worker outright: lost, its call ends with worker_lost; the next call succeeds
        # on the other worker.
        killed = workers[held_call["worker"]]
        survivor = next(w for w in workers.values() if w is not killed)
        os.kill(killed.process.pid, signal.SIGKILL)
        lost = await events_b.wait_for(
            lambda e: e.type == "worker.lost" and e.subject["id"] == killed.id, within=10, what="worker.lost"
        )
        ended = await events_b.wait_for(_ended(held_call["id"]), within=5, what="call.ended of the held call")
        assert ended.subject["end_reason"] == "worker_lost"
        assert ended.id is not None and lost.id is not None and ended.id > lost.id
        assert (await api_a.get(f"/v1/workers/{killed.id}")).json()["status"] == "lost"
        assert (await api_a.get("/v1/calls", params={"worker": killed.id, "live": "true"})).json()["items"] == []
        await lb.wait_target(killed.sip_target, active=False, within=10)
        await brief.dial(lb.sip_uri("agent"))
        await brief.wait_established(within=15, nth=2)
        [after_kill] = await poll(lambda: _live_calls(api_b, 1), within=10, what="the call after the kill")
        assert after_kill["worker"] == survivor.id
        await brief.wait_closed(within=15, nth=2)
        assert _heard_own_speech(brief, speech_8k, nth=1) >= 0.9

        # 4. The killed worker, started again under its id and ports, registers and is back in rotation.
        workers[killed.id] = restarted = await start_worker(
            peer_procs,
            killed.id,
            control=plane_a,
            fallback=plane_b,
            ports=(killed.sip_port, killed.api_port),
            name=f"{killed.id}-again",
        )
        await poll(lambda: _worker_state(api_b, restarted.id, "up"), within=10, what="the restarted worker up")
        await lb.wait_target(restarted.sip_target, active=True, within=10)

        # 5. Drain the worker carrying a live call with `gateway drain --wait`: new calls go to the other worker,
        # the live call goes on to its end, and then the command returns 0.
        await long.dial(lb.sip_uri("agent"))
        await long.wait_established(within=10)
        [long_call] = await poll(lambda: _live_calls(api_a, 1), within=10, what="the long call")
        drained = workers[long_call["worker"]]
        other = next(w for w in workers.values() if w is not drained)
        drain = await peer_procs.start(
            "gateway-drain",
            [
                sys.executable,
                "-m",
                "gateway",
                "drain",
                "--api",
                f"http://127.0.0.1:{drained.api_port}",
                "--no-deadline",
                "--wait",
            ],
            env=_env(),
            lifetime=60,
        )
        await drain.wait_for_output(r"gateway drain: 1 call\(s\) still up", within=10)
        await events_a.wait_for(
            lambda e: e.type == "worker.draining" and e.subject["id"] == drained.id, within=5, what="draining"
        )
        await lb.wait_target(drained.sip_target, active=False, within=10)  # its OPTIONS answers are 503 now
        # The workers' open probe paths (a Kubernetes readinessProbe): the drained one is not ready.
        async with httpx.AsyncClient(timeout=5) as probe:
            health = await probe.get(f"http://127.0.0.1:{drained.api_port}/healthz")
            assert (health.status_code, health.json()) == (200, {"ok": True})
            ready = await probe.get(f"http://127.0.0.1:{drained.api_port}/readyz")
            assert ready.status_code == 503 and ready.json()["draining"] is True and ready.json()["live_calls"] == 1
            assert (await probe.get(f"http://127.0.0.1:{other.api_port}/readyz")).json()["ready"] is True
        await brief.dial(lb.sip_uri("agent"))
        await brief.wait_established(within=10, nth=3)
        moved = await poll(lambda: _live_calls(api_b, 1, worker=other.id), within=10, what="a call on the other")
        assert _by_caller(moved).keys() == {"brief"}
        assert (await api_b.get(f"/v1/calls/{long_call['id']}")).json()["state"] == "active"
        assert drain.running  # it waits for the long call
        await brief.wait_closed(within=15, nth=3)
        assert _heard_own_speech(brief, speech_8k, nth=2) >= 0.9
        await long.wait_closed(within=30)
        long_end = await events_a.wait_for(_ended(long_call["id"]), within=5, what="call.ended of the long call")
        assert long_end.subject["end_reason"] == "caller_hangup" and long_end.subject["worker"] == drained.id
        assert _heard_own_speech(long, speech_8k) >= 0.9
        assert await drain.wait(within=10) == 0
        assert "gateway drain: no call left" in drain.output
        assert (await api_b.get(f"/v1/workers/{drained.id}")).json()["status"] == "draining"

        # An orderly stop (SIGTERM) of the empty drained worker exits 0 and is reported as gone, not lost.
        assert await drained.process.terminate(grace=10) == 0
        await events_a.wait_for(
            lambda e: e.type == "worker.gone" and e.subject["id"] == drained.id, within=5, what="worker.gone"
        )
        assert (await api_a.get(f"/v1/workers/{drained.id}")).json()["status"] == "gone"
        assert (await api_a.get("/readyz")).json()["workers_up"] == 1


async def _worker_states(api: httpx.AsyncClient) -> set[tuple[str, str]]:
    return {(w["id"], w["status"]) for w in (await api.get("/v1/workers")).json()["items"]}


async def _worker_state(api: httpx.AsyncClient, worker_id: str, status: str) -> bool:
    return (worker_id, status) in await _worker_states(api)


async def _plane_view(api: httpx.AsyncClient) -> dict[str, Any]:
    """What a user sees of the fleet: workers and their states, and every call with its state and worker."""
    calls = (await api.get("/v1/calls", params={"limit": 100})).json()["items"]
    return {
        "workers": await _worker_states(api),
        "calls": {(c["id"], c["from"], c["state"], c["worker"], c.get("end_reason")) for c in calls},
    }


async def _same_view(api: httpx.AsyncClient, before: dict[str, Any]) -> bool:
    try:
        return await _plane_view(api) == before
    except httpx.HTTPError:
        return False


def _correlation(sent: Any, heard: Any) -> float:
    correlation, _ = align_and_correlate(sent.samples, heard.samples, sent.rate, max_slip_seconds=0.15)
    return correlation


def _ended(call_id: str) -> Any:
    def match(event: SseEvent) -> bool:
        return event.type == "call.ended" and event.call_id == call_id

    return match
