"""``gateway loadtest`` against a real ``gateway run`` process: 30 echo calls for 10 s, and 10 over a bursty network.

Asserts what the load tester promises: every call answered, zero RTP loss, and for every call its markers
came back (a round-trip latency per marker) and its speech came back as sent. Speech is espeak-ng's when
installed (cached), else the built-in speech-like signal, so the test does not need a peer binary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.procs import ProcessGroup

pytestmark = pytest.mark.timeout(180)


async def run_loadtest(procs: ProcessGroup, gateway: GatewayProcess, report: Path, *options: str) -> None:
    """``gateway loadtest`` against ``gateway`` with ``options``, to completion (90 s at most), JSON to ``report``."""
    rtp = f"{gateway.rtp_range[1] + 1000}-{gateway.rtp_range[1] + 1199}"
    target = f"127.0.0.1:{gateway.sip_port}"
    argv = [sys.executable, "-m", "gateway", "loadtest", "--target", target, "--rtp-ports", rtp, "--json", str(report)]
    load = await procs.start("loadtest", [*argv, *options], lifetime=90)
    assert await load.wait(within=90) == 0, load.output


async def test_thirty_echo_calls_lose_nothing_and_come_back_right(tmp_path: Path) -> None:
    report = tmp_path / "loadtest.json"
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env={"GATEWAY_SIP_RATE_LIMIT_PER_S": "1000"}, lifetime=120)
        await run_loadtest(procs, gateway, report, "--calls", "30", "--cps", "15", "--duration", "10")
    summary = json.loads(report.read_text())
    assert summary["calls"] == 30 and summary["answered"] == 30, summary["statuses"]
    assert summary["packets_lost"] == 0 and summary["sequence_errors"] == 0
    assert summary["packets_received"] >= 30 * 450  # 10 s at 50 packets/s, less the hang-up edge
    # two markers per call (1 s lead-in, then 1.2 s talk + 3 s pause twice): each came back, speech matched
    assert summary["markers_expected"] == 60
    assert summary["markers_found"] == 60 and summary["calls_with_all_markers"] == 30
    assert summary["rtt_ms"]["count"] == 60 and 0 < summary["rtt_ms"]["max"] < 1000
    assert summary["audio_checked"] == 30 and summary["audio_ok"] == 30
    assert summary["setup_ms"]["count"] == 30


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
    # the bursts reached the gateway: every call's first one outlasted its jitter buffer ...
    underruns = _counter(metrics, "gateway_playout_events_total", 'event="underrun"')
    assert underruns >= 10, underruns
    # ... and the buffers kept the delay it needed instead of giving it back and underrunning on each of the
    # five bursts (about 2 a call with the hold, 5 without it)
    assert underruns <= 10 * 3, underruns
    assert summary["markers_found"] == summary["markers_expected"] == 20
    assert summary["audio_checked"] == 10 and summary["audio_ok"] == 10
