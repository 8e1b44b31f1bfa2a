"""A small async process manager for the real-peer test harness.

It owns every external program a test starts (baresip, pjsua2 helper, Kamailio, redis-server, ...):

- each process is started in its own session (so its process group id is its PID) with stdin from
  /dev/null, its stdout+stderr copied to a log file for debugging and kept in memory for readiness checks;
- each process has a lifetime: a watchdog terminates it when the lifetime is over, so nothing outlives a
  hung test;
- readiness is awaited on a condition with a deadline (a regex in the output, a TCP/UDP port bound);
- stopping is SIGTERM to the process group of that PID, then SIGKILL after a grace period; an `atexit`
  hook kills whatever is still registered if the interpreter exits early.

`ProcessGroup` is the owner: `async with ProcessGroup(log_dir) as procs: p = await procs.start(...)`.
Ports for peers come from `PortAllocator` (UDP and TCP both free, in a block of consecutive ports).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

__all__ = [
    "ManagedProcess",
    "PortAllocator",
    "ProcessExitedError",
    "ProcessGroup",
    "ReadinessTimeoutError",
    "free_ports",
    "port_is_bound",
]

# PIDs (= process group ids) still running, for the atexit safety net.
_LIVE: set[int] = set()


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` exists that is not a zombie."""
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


async def _wait_group_gone(pgid: int, *, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return
        # SIGKILL is delivered asynchronously; there is no event for a non-child's death.
        await asyncio.sleep(0.02)


@atexit.register
def _kill_leftovers() -> None:
    for pid in list(_LIVE):
        _kill_group(pid, signal.SIGKILL)


class ReadinessTimeoutError(TimeoutError):
    """A process did not become ready (line or port) before its deadline."""


class ProcessExitedError(RuntimeError):
    """A process exited while we were waiting for it to become ready."""


class ManagedProcess:
    """One external program: output captured to `log_path`, stopped by PID."""

    def __init__(self, name: str, argv: Sequence[str], proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._proc = proc
        self._output = bytearray()
        self._changed = asyncio.Event()
        self._line_callbacks: list[Callable[[str], None]] = []
        self._partial = b""
        self._reader_task = asyncio.create_task(self._pump(), name=f"{name}-output")
        self._watchdog_task: asyncio.Task[None] | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} log={self.log_path}>"

    # -- output -----------------------------------------------------------------------------------------

    async def _pump(self) -> None:
        assert self._proc.stdout is not None
        with self.log_path.open("ab") as log:
            while True:
                chunk = await self._proc.stdout.read(65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                self._output += chunk
                self._dispatch_lines(chunk)
                self._changed.set()
        self.returncode = await self._proc.wait()
        _LIVE.discard(self.pid)
        self._changed.set()

    def _dispatch_lines(self, chunk: bytes) -> None:
        if not self._line_callbacks:
            return
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            for callback in self._line_callbacks:
                callback(line)

    def on_line(self, callback: Callable[[str], None]) -> None:
        """Call `callback(line)` for each complete output line from now on (register right after start)."""
        self._line_callbacks.append(callback)

    @property
    def output(self) -> str:
        return self._output.decode("utf-8", "replace")

    @property
    def running(self) -> bool:
        return self.returncode is None and self._proc.returncode is None

    async def wait_for_output(self, pattern: str | re.Pattern[str], *, within: float) -> re.Match[str]:
        """Wait until the output matches `pattern` (regex); fail if the process exits first."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + within
        while True:
            # Clear before looking, so output that arrives while we look wakes the wait below.
            self._changed.clear()
            match = regex.search(self.output)
            if match is not None:
                return match
            if not self.running and self._reader_task.done():
                raise ProcessExitedError(
                    f"{self.name} exited with {self.returncode} before printing {regex.pattern!r}; log: {self.log_path}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReadinessTimeoutError(
                    f"{self.name} did not print {regex.pattern!r} in {within}s; log: {self.log_path}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=remaining)

    async def wait_for_port(self, port: int, *, within: float, kind: str = "tcp", host: str = "127.0.0.1") -> None:
        """Wait until `port` is bound on `host` (TCP: accepts a connection; UDP: no longer bindable)."""
        deadline = time.monotonic() + within
        delay = 0.01
        while True:
            if not self.running:
                raise ProcessExitedError(
                    f"{self.name} exited with {self.returncode} before binding {kind}/{port}; log: {self.log_path}"
                )
            if kind == "tcp":
                try:
                    _, writer = await asyncio.open_connection(host, port)
                except OSError:
                    pass
                else:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
                    return
            elif port_is_bound(port, kind="udp", host=host):
                return
            if time.monotonic() >= deadline:
                raise ReadinessTimeoutError(
                    f"{self.name} did not bind {kind}/{port} in {within}s; log: {self.log_path}"
                )
            # Polling a socket has no event to wait on; back off so a slow start costs little CPU.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    # -- lifetime ---------------------------------------------------------------------------------------

    def _arm_watchdog(self, lifetime: float) -> None:
        async def expire() -> None:
            await asyncio.sleep(lifetime)
            if self.running:
                with self.log_path.open("a") as log:
                    log.write(f"\n[procs] lifetime of {lifetime}s is over: terminating pid {self.pid}\n")
                await self.terminate()

        self._watchdog_task = asyncio.create_task(expire(), name=f"{self.name}-watchdog")

    async def wait(self, *, within: float) -> int:
        """Wait for the process to exit by itself; its return code."""
        try:
            await asyncio.wait_for(asyncio.shield(self._reader_task), timeout=within)
        except TimeoutError:
            raise ReadinessTimeoutError(f"{self.name} did not exit within {within}s; log: {self.log_path}") from None
        assert self.returncode is not None
        return self.returncode

    async def terminate(self, *, grace: float = 3.0) -> int | None:
        """SIGTERM the process group of this PID, SIGKILL after `grace` seconds; its return code."""
        if self.running:
            _kill_group(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._proc.wait()), timeout=grace)
            except TimeoutError:
                _kill_group(self.pid, signal.SIGKILL)
                await self._proc.wait()
        # Children that ignored SIGTERM while the leader exited still share the group: make sure.
        _kill_group(self.pid, signal.SIGKILL)
        await _wait_group_gone(self.pid, within=grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader_task), timeout=grace)
        if self._watchdog_task is not None and self._watchdog_task is not asyncio.current_task():
            self._watchdog_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog_task
        _LIVE.discard(self.pid)
        self.returncode = self._proc.returncode
        return self.returncode


class ProcessGroup:
    """Owns the processes of one test; `aclose()` stops them all by PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[ManagedProcess] = []

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        lifetime: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> ManagedProcess:
        """Start `argv` with stdin from /dev/null; it is terminated after `lifetime` seconds at the latest.

        `on_line` is called with each complete line of output, from the first one on.
        """
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("a") as log:
            log.write(f"[procs] {' '.join(argv)}\n")
        full_env = None if env is None else {**os.environ, **env}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
        )
        _LIVE.add(proc.pid)
        managed = ManagedProcess(name, argv, proc, log_path)
        if on_line is not None:
            managed.on_line(on_line)
        managed._arm_watchdog(lifetime)
        self.processes.append(managed)
        return managed

    async def aclose(self) -> None:
        results = await asyncio.gather(*(p.terminate() for p in reversed(self.processes)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    def describe_logs(self) -> str:
        """One line per process: name, PID, exit code, log file (print this when a test fails)."""
        return "\n".join(f"  {p.name} pid={p.pid} rc={p.returncode} log={p.log_path}" for p in self.processes)


# -- ports ------------------------------------------------------------------------------------------------


def port_is_bound(port: int, *, kind: str, host: str = "127.0.0.1") -> bool:
    """True when `port` cannot be bound on `host` for `kind` ("udp" or "tcp")."""
    sock_type = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, sock_type) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class PortAllocator:
    """Hands out blocks of consecutive ports that are free for both UDP and TCP on 127.0.0.1.

    Blocks are drawn at random below the kernel's ephemeral range and never handed out twice by one
    process, so parallel tests (and parallel pytest workers, with high probability) do not collide.
    """

    def __init__(self, low: int = 12000, high: int = 31000, *, rng: random.Random | None = None) -> None:
        self._low, self._high = low, high
        self._given: set[int] = set()
        self._rng = rng or random.Random()

    def block(self, count: int = 1) -> list[int]:
        for _ in range(500):
            start = self._rng.randrange(self._low, self._high - count)
            ports = list(range(start, start + count))
            if any(p in self._given for p in ports):
                continue
            if any(port_is_bound(p, kind="udp") or port_is_bound(p, kind="tcp") for p in ports):
                continue
            self._given.update(ports)
            return ports
        raise RuntimeError(f"no block of {count} free UDP+TCP ports in {self._low}..{self._high}")


_ALLOCATOR = PortAllocator()


def free_ports(count: int = 1) -> list[int]:
    """`count` consecutive ports free for UDP and TCP on 127.0.0.1, never returned twice in this process."""
    return _ALLOCATOR.block(count)
