"""``gateway loadtest`` against a real ``gateway run`` process: 30 echo calls for 10 s, 20 G.722 calls, 10 Opus
calls over a lossy network, and 10 over a bursty one.

Asserts what the load tester promises: every call answered, zero RTP loss, and for every call its markers
came back (a round-trip latency per marker) and its speech came back as sent. Speech is espeak-ng's when
installed (cached), else the built-in speech-like signal, so the test does not need a peer binary.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.machine import MachineWatch, assert_quality
from tests.support.procs import ProcessGroup

pytestmark = pytest.mark.timeout(180)


async def run_loadtest(procs: ProcessGroup, gateway: GatewayProcess, report: Path, *options: str) -> None:
    """``gateway loadtest`` against ``gateway`` with ``options``, to completion (90 s at most), JSON to ``report``."""
    rtp = f"{gateway.rtp_range[1] + 1000}-{gateway.rtp_range[1] + 1199}"
    target = f"127.0.0.1:{gateway.sip_port}"
    argv = [sys.executable, "-m", "gateway", "loadtest", "--target", target, "--rtp-ports", rtp, "--json", str(report)]
    load = await procs.start("loadtest", [*argv, *options], lifetime=90)
    assert await load.wait(within=90) == 0, load.output


def quality(summary: dict) -> str:
    """The figures a missed quality bar is judged by, for its message."""
    keep = ("packets_lost", "sequence_errors", "markers_found", "markers_expected", "audio_ok", "audio_checked")
    return f"{ {key: summary.get(key) for key in keep} }, pacing p99 {summary.get('pacing_error_ms', {}).get('p99')} ms"


async def test_thirty_echo_calls_lose_nothing_and_come_back_right(tmp_path: Path) -> None:
    report = tmp_path / "loadtest.json"
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env={"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000"}, lifetime=120)
        watch = MachineWatch.start()
        await run_loadtest(procs, gateway, report, "--calls", "30", "--cps", "15", "--duration", "10")
        machine = watch.stop()
    summary = json.loads(report.read_text())
    # Any machine: every call answered, set up and checked, its audio sent back.
    assert summary["calls"] == 30 and summary["answered"] == 30, summary["statuses"]
    assert summary["setup_ms"]["count"] == 30 and summary["audio_checked"] == 30
    assert summary["packets_received"] >= 30 * 450  # 10 s at 50 packets/s, less the hang-up edge
    # The quality bar (a busy machine is named, not blamed on the gateway: ADR 0023): nothing lost, and two
    # markers per call (1 s lead-in, then 1.2 s talk + 3 s pause twice) came back with the speech matching.
    assert summary["markers_expected"] == 60
    assert_quality(
        summary["packets_lost"] == 0
        and summary["sequence_errors"] == 0
        and summary["markers_found"] == 60
        and summary["calls_with_all_markers"] == 30
        and summary["rtt_ms"]["count"] == 60
        and 0 < summary["rtt_ms"]["max"] < 1000
        and summary["audio_ok"] == 30,
        quality(summary),
        machine,
    )


async def test_g722_callers_lose_nothing_and_come_back_right(tmp_path: Path) -> None:
    """16 kHz speech as G.722 on its 8000 RTP clock, through the gateway's G.722 group and back."""
    report = tmp_path / "loadtest.json"
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env={"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000"}, lifetime=120)
        watch = MachineWatch.start()
        await run_loadtest(
            procs, gateway, report, "--codec", "g722", "--calls", "20", "--cps", "10", "--duration", "10"
        )
        machine = watch.stop()
        calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    summary = json.loads(report.read_text())
    assert summary["calls"] == 20 and summary["answered"] == 20, summary["statuses"]
    assert summary["audio_checked"] == 20 and summary["markers_expected"] == 40
    items = calls["items"] if isinstance(calls, dict) else calls
    assert {item["codec"] for item in items} == {"G722"}
    assert_quality(
        summary["packets_lost"] == 0
        and summary["sequence_errors"] == 0
        and summary["markers_found"] == 40
        and summary["audio_ok"] == 20
        and summary["pacing_error_ms"]["p99"] < 20,  # judged on the 8000 clock: 160 per 20 ms
        quality(summary),
        machine,
    )


@pytest.mark.parametrize("ahead_ms", ["2", "0"], ids=["default", "encoded-ahead"])
async def test_opus_callers_over_a_lossy_network_come_back_right(tmp_path: Path, ahead_ms: str) -> None:
    """Opus both ways, 3 % of the callers' packets lost on the way in. Each marker goes through two Opus passes
    (the caller's encoder, then the gateway's), which bend some markers' waveform; every marker must still be
    found, every call's speech match, and nothing slip: the gateway conceals a lost frame in its place. The same
    with every call encoded a tick ahead (GATEWAY_OPUS_ENCODE_AHEAD_MS=0), each moved inside a pause."""
    report = tmp_path / "loadtest.json"
    env = {"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000", "GATEWAY_OPUS_ENCODE_AHEAD_MS": ahead_ms}
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env=env, lifetime=120)
        options = ("--codec", "opus", "--calls", "10", "--cps", "10", "--duration", "16", "--impair-loss", "3")
        watch = MachineWatch.start()
        await run_loadtest(procs, gateway, report, *options)
        machine = watch.stop()
        async with gateway.client() as client:
            metrics = (await client.get("/metrics")).text
    if ahead_ms == "0":
        # A call moves only inside a settled pause (exact zeros): the echo agent's silence is the caller's
        # decoded Opus, seldom exact zeros, so how many of the ten find one depends on timing (2 to 10 here).
        assert _counter(metrics, "gateway_opus_encode_moves_total", 'to="ahead"') >= 1
    summary = json.loads(report.read_text())
    assert summary["calls"] == 10 and summary["answered"] == 10, summary["statuses"]
    assert summary["generator"]["impair_dropped"] > 0
    assert summary["packets_lost"] == 0 and summary["sequence_errors"] == 0  # on the way back
    assert summary["markers_expected"] == 30  # three talk spurts a call
    assert summary["markers_found"] == 30 and summary["calls_with_all_markers"] == 10
    # The loss pattern is the same in every run, and it leaves one spurt of one call at 0.62-0.64 against the 0.6
    # Opus threshold (0.633 in most runs, FEC-decoded as the rest; 0.619 where the buffers ran at their shallowest):
    # a run's timing may take it under. Every other spurt reads 0.71 or more.
    assert summary["audio_checked"] == 10 and summary["audio_ok"] >= 9
    assert summary["correlation_min"]["p50"] >= 0.75, summary["correlation_min"]
    # Nothing moved: the gateway conceals each lost frame in its place, also a loss met when its jitter buffer
    # was a frame deep (that one used to re-buffer: 3-4 slips in some runs, two of them in CI). A stall of a
    # busy machine may make a jitter buffer drop or insert a frame or two, so this bar is the machine's too
    # (ADR 0023): a CI run whose serial tier ran 10 % slower than the one before read 10 slips here, while
    # stopping the gateway or the load tester for 120 ms seven times in a run here reads 0-1.
    assert_quality(summary["slips"] <= 2, f"slips {summary['slips']}; {quality(summary)}", machine)


def _counter(metrics: str, name: str, label: str) -> float:
    """Sum of the samples of counter ``name`` whose labels include ``label``."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + "{") and label in line
    )


async def test_over_a_bursty_network_every_calls_audio_still_comes_back_right(tmp_path: Path) -> None:
    """Each caller's packets are held 80 ms every 2 s (plus 0-10 ms of jitter) on their way to the gateway."""
    report = tmp_path / "loadtest.json"
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env={"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000"}, lifetime=120)
        burst = ("--impair-burst", "80", "--impair-burst-every", "2", "--impair-jitter", "10")
        await run_loadtest(procs, gateway, report, "--calls", "10", "--cps", "10", "--duration", "10", *burst)
        async with gateway.client() as client:
            metrics = (await client.get("/metrics")).text
    summary = json.loads(report.read_text())
    assert summary["answered"] == 10 and summary["generator"]["impair_delayed"] >= 10 * 4 * 4
    # the bursts reached the gateway: a call's first one outlasts its jitter buffer (unless the 0-10 ms jitter
    # before it had already grown that buffer enough: one call of ten did so in a CI run) ...
    underruns = _counter(metrics, "gateway_playout_events_total", 'event="underrun"')
    assert underruns >= 8, underruns
    # ... and the buffers kept the delay it needed instead of giving it back and underrunning on each of the
    # five bursts (about 2 a call with the hold, 5 without it)
    assert underruns <= 10 * 3, underruns
    assert summary["markers_found"] == summary["markers_expected"] == 20
    assert summary["audio_checked"] == 10 and summary["audio_ok"] == 10


async def _calls_in_state(
    gateway: GatewayProcess, state: str, count: int, *, within: float, packets_in: int = 0
) -> list[dict[str, Any]]:
    """The gateway's calls in ``state`` once there are ``count`` of them, each with ``packets_in`` RTP packets
    received (polled until ``within`` s pass)."""
    deadline = time.monotonic() + within
    while True:
        page = await gateway.api("GET", "/v1/calls", params={"state": state, "limit": 100})
        if len(page["items"]) == count and all(c["stats"]["rtp_packets_in"] >= packets_in for c in page["items"]):
            return list(page["items"])
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(page['items'])} calls {state}, not {count}, after {within:.0f} s")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_mid_run_hangs_up_every_call_and_still_reports(tmp_path: Path, workers: int) -> None:
    """Stopped halfway through 60 s calls, the load tester hangs them up (BYE) and reports what ran."""
    report = tmp_path / "loadtest.json"
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env={"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000"}, lifetime=120)
        rtp = f"{gateway.rtp_range[1] + 1000}-{gateway.rtp_range[1] + 1199}"
        argv = [sys.executable, "-m", "gateway", "loadtest", "--target", f"127.0.0.1:{gateway.sip_port}"]
        argv += ["--rtp-ports", rtp, "--json", str(report), "--calls", "6", "--cps", "20", "--duration", "60"]
        load = await procs.start("loadtest", [*argv, "--workers", str(workers)], lifetime=90)
        # 6 s into every call: the first talk spurt (1 s lead-in, 1.2 s of talk) and its reply (3 s pause) are over.
        await _calls_in_state(gateway, "active", 6, within=30, packets_in=6 * 50)
        os.kill(load.pid, signal.SIGTERM)
        assert await load.wait(within=30) == 130, load.output
        # Ended by the callers' BYE, not left to the gateway's RTP timeout.
        ended = await _calls_in_state(gateway, "ended", 6, within=10)
    assert {call["end_reason"] for call in ended} == {"caller_hangup"}
    summary = json.loads(report.read_text())
    assert summary["interrupted"] is True and summary["elapsed_s"] < 45
    assert summary["calls"] == summary["answered"] == 6
    assert summary["outcomes"] == {"interrupted": 6}
    # Judged on the spurts each call lived through with their reply, not on the 60 s it was planned for.
    assert summary["markers_expected"] == summary["markers_found"] >= 6
    assert summary["packets_lost"] == 0 and summary["audio_ok"] == summary["audio_checked"] == 6
    assert "interrupted" in load.output
