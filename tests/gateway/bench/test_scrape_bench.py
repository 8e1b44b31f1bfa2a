"""`gateway bench scrape`: a loaded worker's registry, rendered both ways, with the same bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.bench.scrape import loaded_registry, samples_of
from gateway.observability import REGISTRY

ROOT = Path(__file__).resolve().parents[3]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "scrape", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_loaded_registry_has_every_metric_of_the_gateway_with_its_labels_filled() -> None:
    from prometheus_client import generate_latest

    ours = {family.name for family in REGISTRY.collect()}
    text = generate_latest(loaded_registry())
    assert {family.name for family in loaded_registry().collect()} == ours
    assert b'gateway_gc_pause_seconds_bucket{generation="1",le="0.005",trigger="tick"}' in text
    assert b'gateway_tick_seconds_bucket{le="0.018",worker="bench"}' in text
    assert samples_of(text) > 200


def test_a_run_reports_both_ways_and_that_they_render_the_same_bytes() -> None:
    done = bench("--renders", "5", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["same_bytes"] is True and report["renders"] == 5 and report["samples"] > 200
    assert set(report["rows"]) == {"generate_latest", "exposition"}
    for row in report["rows"].values():
        assert 0 < row["held_ms_median"] <= row["held_ms_p99"] <= row["held_ms_max"]
        assert row["cpu_ms_median"] > 0
    table = bench("--renders", "2")
    assert table.returncode == 0, table.stderr
    assert "exposition / generate_latest: loop held" in table.stdout
    assert bench("--renders", "0").returncode != 0
