"""``gateway bench cluster`` run for real at a small size: Kamailio, a control plane, two workers, the fake provider
and the generator. Its figures are there and sane; Ctrl-C, SIGTERM or a worker dying stop everything it started;
without Kamailio it says what is missing and exits 2."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.bench.process_tree import alive, wait_until
from tests.support.peers import require_binary

ROOT = Path(__file__).resolve().parents[2]


def _require_cluster_peers() -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")


def _bench(*argv: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "bench", "cluster", *argv]


@pytest.mark.peer
@pytest.mark.timeout(240)
def test_a_small_run_measures_both_placements(tmp_path: Path) -> None:
    _require_cluster_peers()
    report = tmp_path / "cluster.json"
    argv = _bench("--calls", "6", "--cps", "10", "--window", "3", "--repeats", "1", "--json", str(report))
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(report.read_text())
    rows = {row["placement"]: row for row in document["rows"]}
    direct, through = rows["direct"], rows["kamailio"]
    for row in (direct, through):
        assert row["calls"] == row["answered"] == 6 and row["failed"] == 0 and row["statuses"] == {}
        assert row["admitted"] == 6 and row["refused"] == 0  # every call was admitted by the control plane
        assert row["audio_checked"] == row["audio_ok"] == 6  # the echo check: every call's speech came back
        assert row["loss_pct"] == 0
        # INVITE -> 200 OK at the generator: measured, ordered, and longer than the worker's own share of it
        assert 0 < row["setup_p50_ms"] <= row["setup_p95_ms"] <= row["setup_p99_ms"] <= row["setup_max_ms"] < 2000
        assert 0 < row["worker_setup_mean_ms"] < row["setup_max_ms"]
        assert 0 < row["us_per_call_frame"] < 20_000  # under a whole core per call
    assert direct["landed"] == [6, 0] and direct["worker_us"][1] is None
    assert through["landed"][0] > 0 and through["landed"][1] > 0 and sum(through["landed"]) == 6  # both workers
    assert all(0 < us < 20_000 for us in through["worker_us"])
    assert through["targets_active"] == 2  # neither worker was marked down by a failure
    assert through["control_us_per_call_s"] is not None and direct["load_1m"] >= 0
    assert direct["generator_skipped"] >= 0 and document["equal_calls_per_worker"] == []  # 6 calls: no 3-call run
    assert through["kamailio_us_per_call"] is not None and math.isfinite(through["kamailio_us_per_call"])
    [comparison] = document["comparisons"]
    assert comparison["calls"] == 6 and comparison["cpu_ratio"] > 0
    assert document["config"]["worker_cores"] and "load_average_before_after" in document["config"]
    out = done.stdout
    assert "CPU is measured per process (CPU time, not wall-clock capacity)" in out
    assert "calls per worker" in out and "6 calls: through Kamailio the workers spent" in out
    assert "idle, no call up (% of a core): kamailio" in out and "load average before/after" in out
    assert "not clean" not in done.stderr


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _cluster_with_calls(bench: psutil.Process) -> list[psutil.Process] | None:
    """Every process under the bench once both workers hold RTP sockets for calls (a phase through Kamailio, or
    the warm-up, is under way) and Kamailio's children are up."""
    tree = bench.children(recursive=True)
    workers = [p for p in tree if "gateway worker" in _cmdline(p)]
    try:
        with_calls = len(workers) == 2 and all(len(w.net_connections(kind="udp")) >= 5 for w in workers)
    except psutil.Error:
        return None
    kamailio = [p for p in tree if _cmdline(p).startswith("kamailio")]
    return tree if with_calls and len(kamailio) >= 3 else None


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job starts with SIGINT ignored, and Python keeps it so: give the bench the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _assert_all_ended(tree: list[psutil.Process]) -> None:
    wait_until("every process the bench started to end", lambda: not any(alive(p) for p in tree), 15)


@pytest.mark.peer
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_mid_run_stops_every_process_it_started(signum: int) -> None:
    _require_cluster_peers()
    proc = _start(_bench("--calls", "10", "--cps", "10", "--window", "60", "--repeats", "1"))
    try:
        tree = wait_until("the workers carrying calls", lambda: _cluster_with_calls(psutil.Process(proc.pid)), 90)
        names = " ".join(_cmdline(p) for p in tree)  # read while they run: one that has ended has no command line
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted; Kamailio, the workers, the control plane and the fake provider are stopped" in err
    assert "Traceback" not in err and "calls per worker" not in out
    assert "kamailio" in names and "gateway control" in names and "fake-provider" in names
    _assert_all_ended(tree)


@pytest.mark.peer
@pytest.mark.timeout(180)
def test_a_worker_killed_mid_run_ends_it_with_how_and_stops_the_rest() -> None:
    _require_cluster_peers()
    proc = _start(_bench("--calls", "10", "--cps", "10", "--window", "60", "--repeats", "1"))
    try:
        tree = wait_until("the workers carrying calls", lambda: _cluster_with_calls(psutil.Process(proc.pid)), 90)
        victim = next(p for p in tree if "--worker-id bench-w2" in _cmdline(p))
        victim.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    assert "gateway bench cluster: no result: worker-2 exited (killed by SIGKILL)" in err
    assert "Traceback" not in err and "calls per worker" not in out
    _assert_all_ended(tree)


def test_without_kamailio_it_says_what_is_missing_and_exits_2(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    done = subprocess.run(
        _bench("--calls", "4", "--redis"), cwd=ROOT, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "gateway bench cluster: cannot run here; missing: kamailio (Debian: apt-get install kamailio)" in done.stderr
    assert "kamcmd" in done.stderr and "redis-server (Debian: apt-get install redis-server), for --redis" in done.stderr


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ("--calls 1", "every size must be 2-1000 calls"),
        ("--calls 5000", "every size must be 2-1000 calls"),
        ("--calls x", "not a list of call counts: 'x'"),
        ("--cps 0", "the call rate must be within (0, 200]"),
        ("--repeats 0", "repeats must be 1-20"),
        ("--window 1", "the window must be 2-300 s"),
        ("--worker-cores 3-1", "not a CPU list: '3-1'"),
    ],
)
def test_a_run_that_cannot_be_bounded_is_refused_with_the_reason(arguments: str, reason: str) -> None:
    done = subprocess.run(_bench(*arguments.split()), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and reason in done.stderr, done.stderr


@pytest.mark.peer
@pytest.mark.timeout(120)
def test_a_kamailio_that_will_not_start_ends_the_run_with_its_log(tmp_path: Path) -> None:
    """A configuration Kamailio rejects: the run names Kamailio, how it ended and the end of its log, and stops the
    control plane, workers and fake provider it had started."""
    _require_cluster_peers()
    config = tmp_path / "broken.cfg"
    config.write_text('#!KAMAILIO\nloadmodule "no_such_module.so"\n')
    proc = _start(_bench("--calls", "4", "--repeats", "1", "--kamailio-config", str(config)))
    try:
        seen: list[psutil.Process] = []

        def workers_up() -> bool:
            with contextlib.suppress(psutil.Error):
                seen[:] = [p for p in psutil.Process(proc.pid).children() if "gateway" in _cmdline(p)]
            return len(seen) >= 4 or proc.poll() is not None  # the fake, the control plane, two workers

        wait_until("the cluster's processes", workers_up, 60)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    assert "gateway bench cluster: no result: Kamailio: kamailio exited (exit status" in err
    assert "no_such_module" in err and "Traceback" not in err and out == ""
    assert len(seen) == 4
    _assert_all_ended(seen)
