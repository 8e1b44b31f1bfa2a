"""The benchmarks' child processes: ready lines, early exits, stopping by PID; ports and pinning."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from bench.processes import BenchProcess, cpu_list, cpus_named, pin


def test_a_process_is_waited_for_by_its_ready_line_and_stopped(tmp_path: Path) -> None:
    script = "import time; print('ready on 4242', flush=True); time.sleep(60)"
    proc = BenchProcess("sleeper", [sys.executable, "-c", script], tmp_path)
    try:
        match = proc.wait_for(r"ready on (\d+)", within=30)
        assert match.group(1) == "4242"
        assert proc.cpu_s() >= 0.0
    finally:
        proc.stop(grace=5)
    assert proc.popen.returncode is not None  # SIGINT ended it
    assert (tmp_path / "sleeper.log").read_text().startswith("ready on 4242")


def test_a_process_that_exits_before_it_is_ready_is_reported_with_its_output(tmp_path: Path) -> None:
    proc = BenchProcess("quitter", [sys.executable, "-c", "print('no config'); raise SystemExit(3)"], tmp_path)
    with pytest.raises(RuntimeError, match=r"quitter exited \(3\):\nno config"):
        proc.wait_for(r"ready", within=30)
    proc.stop()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pinning_to_a_core_this_process_may_use_and_not_to_one_it_may_not() -> None:
    before = os.sched_getaffinity(0)
    try:
        core = min(before)
        assert pin(os.getpid(), core) and os.sched_getaffinity(0) == {core}
        assert not pin(os.getpid(), (os.cpu_count() or 1) + 64)
        assert not pin(os.getpid(), None)
        assert pin(os.getpid(), before) and os.sched_getaffinity(0) == before  # a set of CPUs
        assert not pin(os.getpid(), ())
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("1", (1,)), ("3,1,2", (1, 2, 3)), ("2-5", (2, 3, 4, 5)), ("0,4-5,4", (0, 4, 5)), (" -1 ", ())],
)
def test_a_cpu_list_is_read_as_the_set_of_cpus_it_names(text: str, cpus: tuple[int, ...]) -> None:
    assert cpu_list(text) == cpus
    assert cpus_named(cpus or None) == (",".join(map(str, cpus)) or "any")


@pytest.mark.parametrize("text", ["", "a", "2-1", "-2", "1,,2", "1-"])
def test_what_is_not_a_cpu_list_is_named_in_the_error(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"not a CPU list: {text!r}")):
        cpu_list(text)
