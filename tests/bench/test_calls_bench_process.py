"""``gateway bench calls`` as a process: both designs carry calls right; Ctrl-C or SIGTERM mid-step stops it all;
a worker that dies mid-run is reported with how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

import bench.calls as calls_module
from bench.calls import CallsBench, CallsBenchConfig, WorkerExitedError
from bench.processes import BenchProcess, free_port
from tests.bench.process_tree import alive, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _worker_with_calls(bench: psutil.Process) -> list[psutil.Process] | None:
    """The bench's children once the worker holds RTP sockets for the calls (the step is under way)."""
    children = bench.children()
    for child in children:
        if "bench._worker" in " ".join(child.cmdline()):
            with_calls = len(child.net_connections(kind="udp")) >= 20  # 10 calls: RTP + RTCP each
            return children if with_calls and len(children) >= 2 else None
    return None


@pytest.mark.parametrize(
    ("signum", "load_workers"),
    [(signal.SIGINT, 1), (signal.SIGTERM, 1), (signal.SIGTERM, 2)],
    ids=["sigint", "sigterm", "sigterm-two-load-processes"],
)
def test_a_signal_mid_step_stops_the_bench_its_worker_and_its_fake_provider(signum: int, load_workers: int) -> None:
    argv = ["gateway", "bench", "calls", "--steps", "10", "--window", "60", "--worker-core", "-1", "--load-core", "-1"]
    argv += ["--load-workers", str(load_workers)]
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
        children = wait_until("the worker carrying the step's calls", lambda: _worker_with_calls(bench), 60)
        # Named while they run: a process on its way out has no command line left to read.
        tracker = [child for child in children if "resource_tracker" in " ".join(_cmdline(child))]
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
    # Stopped by the bench before it exited, not left to run on without it: the worker, the fake provider and
    # the load processes. Multiprocessing's resource tracker ends by itself once it sees the bench gone.
    left = [child for child in children if child not in tracker and alive(child)]
    assert left == [], [" ".join(_cmdline(child))[:200] for child in left]
    wait_until("multiprocessing's resource tracker to end", lambda: not any(alive(child) for child in tracker), 10)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _stall_until_exit(proc: subprocess.Popen[str], worker: psutil.Process, stall_s: float, every_s: float) -> None:
    """Freeze ``worker`` for ``stall_s`` every ``every_s`` until ``proc`` exits, as a busy machine descheduling it."""
    try:
        while proc.poll() is None and worker.is_running():
            worker.suspend()
            time.sleep(stall_s)
            worker.resume()
            time.sleep(every_s)
    except psutil.NoSuchProcess:
        pass  # the step ended and the bench stopped its worker
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.resume()


@pytest.mark.parametrize("engine", ["percall", "batched"])
def test_each_design_under_comparison_brings_every_calls_audio_back(engine: str, tmp_path: Path) -> None:
    """The two designs the benchmark compares carry the same calls correctly at a light load, so the figures
    compare cost, not a broken comparator (the per-call design once lost every other frame of agent audio).

    The worker is frozen for 70 ms twice a second throughout, as a loaded CI machine does to it: a design must
    read the packets that queued meanwhile before it plays on (the per-call design once popped its jitter
    buffers dry in its catch-up ticks, which never yielded to the loop)."""
    report = tmp_path / "bench.json"
    argv = ["gateway", "bench", "calls", "--engine", engine, "--provider", "echo", "--steps", "3", "--window", "5"]
    argv += ["--worker-core", "-1", "--load-core", "-1", "--json", str(report)]
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        bench = psutil.Process(proc.pid)
        worker = wait_until("the bench worker", lambda: _child(bench, "bench._worker"), 60)
        _stall_until_exit(proc, worker, stall_s=0.07, every_s=0.43)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    [row] = json.loads(report.read_text())["rows"]
    assert row["calls"] == row["answered"] == 3
    assert row["overruns"] > 0  # the stalls landed inside the measured window
    assert row["audio_checked"] == row["audio_ok"] == 3, row["audio_failures"]
    found, expected = (int(part) for part in row["markers"].split("/"))
    assert found == expected >= 3 and row["lost"] == 0


def _child(parent: psutil.Process, marker: str) -> psutil.Process | None:
    for child in parent.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if marker in " ".join(child.cmdline()):
                return child
    return None


def test_a_load_side_of_several_fakes_and_generator_processes_carries_every_call(tmp_path: Path) -> None:
    """``--fakes 2 --load-workers 2``: two fake providers on one port and two generator processes share the
    calls of a step, and the bench still checks every call's audio and counts the processes' CPU. With
    ``--gc-census`` the worker counts its middle collector passes' objects and the step reports them; with
    ``--scrape-every`` the window's scrapes of the worker's /metrics are made and counted."""
    report = tmp_path / "bench.json"
    argv = ["gateway", "bench", "calls", "--steps", "4", "--window", "4", "--fakes", "2", "--load-workers", "2"]
    argv += ["--worker-core", "-1", "--load-core", "-1", "--json", str(report), "--gc-census", "--scrape-every", "0.5"]
    argv += ["--metrics-render", "generate_latest"]
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(report.read_text())
    assert (document["config"]["fakes"], document["config"]["load_workers"]) == (2, 2)
    [row] = document["rows"]
    assert row["calls"] == row["answered"] == 4 and row["lost"] == 0
    assert row["audio_checked"] == row["audio_ok"] == 4, row["audio_failures"]
    # The generator's CPU includes its two processes: more than the bench process alone spends relaying.
    assert row["loadgen_cpu_pct"] > 1.0 and row["fake_cpu_pct"] > 0.5
    assert "fakes 2, load workers 2" in done.stdout
    # Every 0.5 s of a 4 s window: 7 when each scrape is quick, fewer if the scrapes themselves take long.
    assert 4 <= row["scrapes"] <= 7 and "/metrics scraped every 0.5 s (rendered by generate_latest)" in done.stdout
    # Four calls may not fill the young generations within the window: whether a census ran or not, it is reported.
    assert isinstance(row["gc_census"], list)
    assert "gc census, 4 calls: " in done.stdout


@pytest.mark.parametrize(
    ("argument", "reason"),
    [
        ("--fakes=0", "--fakes and --load-workers must be at least 1"),
        ("--load-workers=0", "--fakes and --load-workers must be at least 1"),
        ("--load-workers=9", "9 load workers for a step of 4 calls"),
        ("--load-core=2-1", "not a CPU list: '2-1'"),
        ("--fakes=2 --provider=echo", "--fakes runs fake OpenAI servers; it needs --provider openai"),
        ("--scrape-every=-1", "--scrape-every must be 0 (off) or a number of seconds"),
    ],
)
def test_a_load_side_that_cannot_be_built_is_refused_with_the_reason(argument: str, reason: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "calls", "--steps", "4", *argument.split()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and reason in done.stderr, done.stderr


def test_a_worker_that_dies_mid_run_is_reported_with_how_it_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker crashing mid-step (a segfault, say) ends the run with how it ended and its log's end, not with
    the connection error of the next /metrics read."""
    crash = "import os, signal; print('serving calls', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    worker = BenchProcess("worker", [sys.executable, "-c", crash], tmp_path)
    worker.popen.wait(30)
    bench = CallsBench(CallsBenchConfig(), directory=tmp_path)
    bench.worker, bench.metrics_port = worker, free_port()

    async def read_metrics() -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            await bench._metrics(client)

    with pytest.raises(WorkerExitedError, match=r"^worker exited \(killed by SIGSEGV\); its log ends:\nserving calls"):
        asyncio.run(read_metrics())
    worker.stop()

    def crashed(config: CallsBenchConfig) -> None:
        raise WorkerExitedError("worker exited (killed by SIGSEGV); its log ends:\nserving calls")

    monkeypatch.setattr(calls_module, "_measure", crashed)
    assert calls_module.run(CallsBenchConfig()) == 1
    assert "gateway bench calls: no result, the worker exited (killed by SIGSEGV)" in capsys.readouterr().err
