"""The benchmarks' child processes: free loopback ports, pinning to a core, niceness, and a process with its
output in a file that is waited for by a ready line and stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import psutil

from gateway.transport.ports import free_port

__all__ = ["BenchProcess", "free_port", "pin", "renice"]


def renice(pid: int, nice: int) -> None:
    if nice:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, pid, nice)


def cpu_list(text: str) -> tuple[int, ...]:
    """``1``, ``1,2,3``, ``2-5`` or ``-1`` (no pinning: the empty tuple); ValueError names what is wrong."""
    if text.strip() == "-1":
        return ()
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            first, last = int(low), int(high if dash else low)
            if first < 0 or last < first:
                raise ValueError(part)
            cpus.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"not a CPU list: {text!r} (say 1, 1,2,3, 2-5 or -1)") from None
    return tuple(sorted(cpus))


def cpus_named(cores: Collection[int] | None) -> str:
    """A list of CPUs as the reports name it: ``1``, ``1,2,3``, or ``any`` (None or empty: not pinned)."""
    return ",".join(map(str, sorted(cores))) if cores else "any"


def pin(pid: int, cores: int | Collection[int] | None) -> bool:
    """Pin ``pid`` (0: this process) to one CPU or a set of them; False when none is given or it cannot be done
    (a CPU this process may not use, or no affinity on this platform)."""
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return False
    wanted = {cores} if isinstance(cores, int) else set(cores)
    try:
        allowed = os.sched_getaffinity(0)
        if not wanted or any(core not in allowed and core >= (os.cpu_count() or 1) for core in wanted):
            return False
        os.sched_setaffinity(pid, wanted)
        return True
    except OSError:
        return False


class BenchProcess:
    """A child process with its output in a file, waited for a ready line, stopped by its PID."""

    def __init__(self, name: str, argv: list[str], directory: Path, *, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = directory / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self.psutil = psutil.Process(self.popen.pid)

    def wait_for(self, pattern: str, within: float) -> re.Match[str]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            match = re.search(pattern, text)
            if match:
                return match
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{text[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready within {within} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the process's output so far."""
        return self.log_path.read_text(errors="replace")[-chars:]

    def exit_report(self) -> str | None:
        """None while the process runs; else how it ended (its exit status or the signal that killed it) and the
        end of its log."""
        code = self.popen.poll()
        if code is None:
            return None
        how = f"exit status {code}"
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        return f"{self.name} exited ({how}); its log ends:\n{self.log_tail()}"

    def cpu_s(self) -> float:
        times = self.psutil.cpu_times()
        return float(times.user + times.system)

    def stop(self, grace: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(2)  # SIGINT: the worker ends its calls; cProfile writes its file
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
