"""``gateway bench call-hook`` run small: every hooked admission got the application's (signed) answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_call_hook_bench_runs_small(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "call-hook", "--calls", "20", "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["failures"] == 0 and row["calls"] == 20
    assert report["median"]["hooked_p50_ms"] > report["median"]["plain_p50_ms"] > 0
    assert "the hook adds" in done.stdout
