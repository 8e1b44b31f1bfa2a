"""``gateway bench call-records`` run small: every call's record is written and the figures are sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_call_records_bench_runs_small(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "bench",
            "call-records",
            "--calls",
            "50",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = json.loads(out.read_text())
    assert run["engine"] == "sqlite" and run["calls"] == 50 and run["lines"] == 20
    assert run["recorded_cpu_us_per_call"] > 0 and run["records_per_s"] > 0
    assert "record µs" in done.stdout
