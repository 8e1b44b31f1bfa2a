"""``gateway bench calls`` as a process: Ctrl-C or SIGTERM in the middle of a step stops it and what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]


def _wait(what: str, check: object, within: float) -> object:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check() if callable(check) else check
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {within:.0f} s: {what}")


def _worker_with_calls(bench: psutil.Process) -> list[psutil.Process] | None:
    """The bench's children once the worker holds RTP sockets for the calls (the step is under way)."""
    children = bench.children()
    for child in children:
        if "gateway.bench._worker" in " ".join(child.cmdline()):
            with_calls = len(child.net_connections(kind="udp")) >= 20  # 10 calls: RTP + RTCP each
            return children if with_calls and len(children) >= 2 else None
    return None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_mid_step_stops_the_bench_its_worker_and_its_fake_provider(signum: int) -> None:
    argv = ["gateway", "bench", "calls", "--steps", "10", "--window", "60", "--worker-core", "-1", "--load-core", "-1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job starts with SIGINT ignored, and Python keeps it so: give the bench the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        bench = psutil.Process(proc.pid)
        children = _wait("the worker carrying the step's calls", lambda: _worker_with_calls(bench), 60)
        assert isinstance(children, list)
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; the worker and the fake provider are stopped" in err
    assert "Traceback" not in err
    assert "sustained by one worker core" not in out  # no table of a run that did not finish
    # Stopped by the bench before it exited, not left to run on without it.
    assert [child.pid for child in children if child.is_running()] == []
