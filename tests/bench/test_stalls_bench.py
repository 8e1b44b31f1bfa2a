"""`gateway bench stalls`: /metrics and a heartbeat, each in one stretch and in slices, with the same content."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client import generate_latest

from bench.stalls import loaded_registry, samples_of
from gateway.observability import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "stalls", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_loaded_registry_has_every_metric_of_the_gateway_with_its_labels_filled() -> None:
    ours = {family.name for family in REGISTRY.collect()}
    text = generate_latest(loaded_registry())
    assert {family.name for family in loaded_registry().collect()} == ours
    assert b'gateway_gc_pause_seconds_bucket{generation="1",le="0.005",trigger="tick"}' in text
    assert b'gateway_tick_seconds_bucket{le="0.018",worker="bench"}' in text
    assert samples_of(text) > 200


def test_a_run_reports_both_ways_of_both_and_that_they_carry_the_same_content() -> None:
    done = bench("--renders", "3", "--calls", "20", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["same"] == {"/metrics": True, "heartbeat, 20 calls": True}
    assert (report["renders"], report["calls"]) == (3, 20) and report["samples"] > 200
    ways = [(row["case"], row["way"]) for row in report["rows"]]
    assert ways == [
        ("/metrics", "generate_latest"),
        ("/metrics", "exposition"),
        ("heartbeat, 20 calls", "one stretch"),
        ("heartbeat, 20 calls", "in slices"),
    ]
    for row in report["rows"]:
        assert 0 < row["held_ms_median"] <= row["held_ms_p99"] <= row["held_ms_max"]
        assert row["cpu_ms_median"] > 0
    table = bench("--renders", "2", "--calls", "5")
    assert table.returncode == 0, table.stderr
    assert "/metrics: exposition / generate_latest: loop held" in table.stdout
    assert "heartbeat, 5 calls: in slices / one stretch: loop held" in table.stdout
    refused = bench("--calls", "0")
    assert refused.returncode != 0 and "--renders and --calls must be at least 1" in refused.stderr
