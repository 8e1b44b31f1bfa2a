"""The load generator spread over processes (``--workers N``), against a reflecting SIP peer (no gateway)."""

from __future__ import annotations

import asyncio
import os

import psutil
import pytest

from gateway.loadtest.config import LoadConfig, LoadConfigError, TalkPattern
from gateway.loadtest.multi import run
from gateway.loadtest.results import aggregate
from tests.gateway.loadtest.echo_peer import EchoPeer
from tests.support.procs import free_ports


async def test_two_processes_share_the_calls_and_name_themselves_as_they_start() -> None:
    (port,) = free_ports(1)
    peer = EchoPeer(port=port, rtp_ports=(35000, 35199))
    await peer.start()
    config = LoadConfig(
        target=("127.0.0.1", port),
        cps=20.0,
        calls=4,
        duration_s=2.0,
        audio="tone",
        talk=TalkPattern(talk_ms=400, pause_ms=600),
        rtp_ports=(36000, 36199),
    )
    named: list[list[int]] = []
    children_then: list[set[int]] = []

    def started(pids: list[int]) -> None:
        named.append(pids)
        children_then.append({child.pid for child in psutil.Process().children()})

    try:
        result = await asyncio.to_thread(run, config, workers=2, started=started)
    finally:
        await peer.aclose()
    summary = aggregate(result)
    assert summary["calls"] == summary["answered"] == 4 and summary["packets_lost"] == 0
    assert summary["audio_ok"] == 4
    [pids] = named  # once, with both processes: this process's children when it was told
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert set(pids) <= children_then[0]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).ppid() == os.getpid() for pid in pids)


def test_more_workers_than_calls_are_refused_before_any_starts() -> None:
    named: list[list[int]] = []
    config = LoadConfig(target=("127.0.0.1", 9), calls=2, duration_s=1.0, rtp_ports=(36200, 36299))
    with pytest.raises(LoadConfigError, match="3 workers for 2 calls"):
        run(config, workers=3, started=named.append)
    assert named == []
