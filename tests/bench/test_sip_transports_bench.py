"""`gateway bench sip-transports`: every transport's round trips complete, the TLS costs are measured, and the
command refuses nonsense counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "sip-transports", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_json_has_every_transport_and_the_tls_costs() -> None:
    done = bench("--json", "--repeats", "2", "--count", "20")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["round_trip_us"]) == {"udp", "tcp", "tls"}
    assert all(50 < us < 100_000 for us in report["round_trip_us"].values()), report
    assert report["ratio_to_udp"]["udp"] == 1.0
    assert 0.05 < report["tls_handshake_ms"] < 200 and 0.5 < report["tls_record_us"] < 5000, report


def test_nonsense_counts_are_refused() -> None:
    done = bench("--count", "3")
    assert done.returncode != 0 and "--count >= 10" in done.stderr
