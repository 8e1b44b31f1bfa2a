"""``gateway loadtest --plot``: matplotlib is the ``plot`` extra. With it a PNG is drawn; without it the command
says how to install it before placing a single call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.loadtest.plot import missing_reason, plot
from gateway.loadtest.results import CallResult, RunResult, TimelineSample

ROOT = Path(__file__).resolve().parents[3]


def test_a_run_is_plotted_to_a_png(tmp_path: Path) -> None:
    assert missing_reason() is None  # the suite installs the plot extra (make setup)
    call = CallResult(
        index=0,
        worker=0,
        placed_s=0.0,
        outcome="completed",
        status=200,
        setup_ms=12.0,
        answered_s=0.1,
        ended_s=2.0,
        jitter_ms=1.5,
        rtt_ms=(40.0, 42.0),
        rtt_at_s=(0.5, 1.5),
    )
    timeline = [
        TimelineSample(t_s=t, up=1, placed=1, failed=0, loss_pct=0.0, jitter_p99_ms=1.5) for t in (0.0, 1.0, 2.0)
    ]
    path = tmp_path / "run.png"
    plot(RunResult(worker=0, started_wall=0.0, elapsed_s=2.0, calls=[call], timeline=timeline), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    # matplotlib made unimportable in a child process: the state of an install without the plot extra.
    png = tmp_path / "run.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None; from gateway.cli import main; "
        f"sys.exit(main(['loadtest', '--target', '127.0.0.1:9', '--calls', '1', '--plot', {str(png)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "gateway loadtest: --plot needs matplotlib, the gateway's plot extra: pip install" in done.stderr
    assert "'voice-gateway[plot]'" in done.stderr
    assert done.stdout == "" and not png.exists()  # no report: nothing was run
