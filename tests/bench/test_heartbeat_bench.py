"""`gateway bench heartbeat`: the three paths track the same calls, the batched one in a constant number of
requests to its own redis-server, the per-call one in a few per call; nonsense sizes are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.heartbeat import snapshots, summarize
from tests.support.peers import require_binary

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "heartbeat", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def test_every_heartbeat_changes_every_call_as_a_live_calls_snapshot_does() -> None:
    first, second = snapshots(3, 4, started=1000.0), snapshots(3, 5, started=1000.0)
    assert [c.id for c in first] == [c.id for c in second] and len({c.id for c in first}) == 3
    for before, after in zip(first, second, strict=True):
        assert before != after and after.stats.rtp_packets_out == before.stats.rtp_packets_out + 50
        assert after.state == "active" and len(after.stats.level_history) == 120


def test_a_run_measures_each_path_and_counts_its_requests(tmp_path: Path) -> None:
    require_binary("redis-server")
    out = tmp_path / "heartbeat.json"
    done = bench("--calls", "5,20", "--heartbeats", "2", "--repeats", "2", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    rows = {(row["calls"], row["path"]): row for row in report["rows"]}
    assert set(rows) == {(calls, path) for calls in (5, 20) for path in ("batched", "per call", "memory")}
    assert len(report["runs"]) == 2 * 3 * 2 and report["rows"] == summarize(report["runs"])
    for calls in (5, 20):
        # Batched: the worker's record read and written, the calls read, written, their events appended, the
        # worker's slots listed, whatever the number of calls. Per call: 4 requests a call and 3 more.
        assert rows[(calls, "batched")]["requests"] == 6
        assert rows[(calls, "per call")]["requests"] == 4 * calls + 3
        assert rows[(calls, "memory")]["requests"] == 0
        for path in ("batched", "per call", "memory"):
            assert rows[(calls, path)]["plane_us_per_call"] > 0 and rows[(calls, path)]["heartbeat_ms"] > 0
    assert "20 calls, per call / batched: plane CPU" in done.stdout


def test_nonsense_sizes_are_refused() -> None:
    done = bench("--heartbeats", "0")
    assert done.returncode != 0 and "must be at least 1" in done.stderr
