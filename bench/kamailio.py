"""Kamailio in front of a benchmark's workers, started the way the project's tests start it.

The configuration is deploy/kamailio/dispatcher.cfg as shipped (the dispatcher module with call-load
distribution, algorithm 10; OPTIONS probes every second; record-route; failover to the next worker on 408/5xx);
what is site-specific comes in as its pre-processor defines: the listen address (loopback, a free UDP port),
the dispatcher list (the workers in set 1, each with a ``duid`` for call-load distribution), the ctl socket in a
private directory, the number of SIP children and the fr timer. ``kamcmd dispatcher.list`` over that socket
tells which workers the OPTIONS probes found answering.

Kamailio forks its children while it starts; once its ctl socket answers they all exist, and each is pinned
and counted (CPU time summed over the whole process tree) by its PID. Stopping sends SIGINT to the main
process, which ends its children; any child still alive after that is killed by its PID.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.processes import BenchProcess, free_port, pin

__all__ = ["DEFAULT_CONFIG", "Balancer", "BalancerError", "DispatcherTarget", "missing_tools", "parse_dispatcher_list"]

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "kamailio" / "dispatcher.cfg"
TOOLS = ("kamailio", "kamcmd")


class BalancerError(RuntimeError):
    """Kamailio did not start, rejected its configuration, or its ctl socket did not answer."""


def missing_tools() -> list[str]:
    """The Kamailio programs this machine lacks (Debian: ``apt-get install kamailio`` brings both)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatcherTarget:
    """One worker as the dispatcher module sees it."""

    set_id: int
    uri: str
    flags: str

    @property
    def active(self) -> bool:
        return self.flags.startswith("A")

    @property
    def probed_active(self) -> bool:
        """Active and confirmed by an OPTIONS probe (flags ``AP``), not merely not failed yet."""
        return self.flags == "AP"

    @property
    def inactive(self) -> bool:
        """Inactive (``I``: taken out after failures) or disabled (``D``)."""
        return self.flags.startswith(("I", "D"))


_SET = re.compile(r"SET:\s*\{\s*ID:\s*(\d+)")
_DEST = re.compile(r"URI:\s*(\S+)\s+FLAGS:\s*(\S+)")


def parse_dispatcher_list(text: str) -> list[DispatcherTarget]:
    """The targets in ``kamcmd dispatcher.list`` output (its nested ``KEY: value`` text form)."""
    targets: list[DispatcherTarget] = []
    sets = list(_SET.finditer(text))
    for index, match in enumerate(sets):
        end = sets[index + 1].start() if index + 1 < len(sets) else len(text)
        for dest in _DEST.finditer(text, match.end(), end):
            targets.append(DispatcherTarget(set_id=int(match.group(1)), uri=dest.group(1), flags=dest.group(2)))
    return targets


def dispatcher_list_text(workers: Sequence[str]) -> str:
    """A dispatcher.list of ``workers`` in set 1; duid names each worker for call-load distribution (see
    deploy/kamailio/dispatcher.list)."""
    return "".join(f"1 {uri} 0 0 duid=w{index};maxload=0\n" for index, uri in enumerate(workers))


def dispatcher_defines(
    *, port: int, list_file: Path, ctl_socket: Path, children: int, fr_timer_ms: int
) -> dict[str, str]:
    """The pre-processor defines of deploy/kamailio/kamailio.cfg for a dispatcher on loopback UDP ``port``."""
    return {
        "LISTEN": f"udp:127.0.0.1:{port}",
        "DS_LIST": f'"{list_file}"',
        "CTL_SOCKET": f'"unix:{ctl_socket}"',
        "WORKERS": str(children),
        "FR_TIMER": str(fr_timer_ms),
    }


def define_args(defines: dict[str, str]) -> list[str]:
    """``-A NAME=VALUE`` for each define, as Kamailio's command line takes them."""
    return [arg for key, value in defines.items() for arg in ("-A", f"{key}={value}")]


class Balancer:
    """One Kamailio dispatching to ``workers`` (SIP URIs such as ``sip:127.0.0.1:5070``) in set 1."""

    def __init__(
        self,
        *,
        workers: Sequence[str],
        directory: Path,
        config: Path = DEFAULT_CONFIG,
        children: int = 2,
        cores: Collection[int] | None = None,
    ) -> None:
        self.workers = list(workers)
        self.config = config
        self.children = children
        self.cores = cores
        self.directory = directory / "kamailio"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.list_file = self.directory / "dispatcher.list"
        self.ctl_socket = self.directory / "kamailio_ctl"
        self.port = free_port(kind=socket.SOCK_DGRAM)
        self.process: BenchProcess | None = None
        self.tree: list[psutil.Process] = []

    def _defines(self) -> list[str]:
        return define_args(
            dispatcher_defines(
                port=self.port,
                list_file=self.list_file,
                ctl_socket=self.ctl_socket,
                children=self.children,
                fr_timer_ms=2000,
            )
        )

    def start(self, *, within: float = 20.0) -> None:
        """Start Kamailio and wait (bounded) for its ctl socket; then pin and note every process of its tree."""
        if not self.config.is_file():
            raise BalancerError(f"no Kamailio configuration at {self.config} (give one with --kamailio-config)")
        self.list_file.write_text(dispatcher_list_text(self.workers))
        argv = ["kamailio", "-f", str(self.config), "-DD", "-E", "-Y", str(self.directory)]
        argv += ["-P", str(self.directory / "kamailio.pid"), *self._defines()]
        self.process = BenchProcess("kamailio", argv, self.directory)
        deadline = time.monotonic() + within
        while True:
            report = self.process.exit_report()
            if report is not None:
                raise BalancerError(report)
            try:
                self.kamcmd("dispatcher.list")
                break
            except BalancerError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        main = self.process.psutil
        self.tree = [main, *main.children(recursive=True)]
        for process in self.tree:
            pin(process.pid, self.cores)

    def kamcmd(self, *command: str) -> str:
        """An RPC command over the ctl socket (bounded to 5 s); BalancerError when it fails."""
        try:
            result = subprocess.run(
                ["kamcmd", "-s", f"unix:{self.ctl_socket}", *command],
                capture_output=True,
                text=True,
                timeout=5,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise BalancerError(f"kamcmd {' '.join(command)} hung") from None
        if result.returncode != 0:
            raise BalancerError(f"kamcmd {' '.join(command)} failed: {(result.stdout + result.stderr).strip()}")
        return result.stdout

    def targets(self) -> list[DispatcherTarget]:
        return parse_dispatcher_list(self.kamcmd("dispatcher.list"))

    def wait_active(self, *, within: float) -> list[DispatcherTarget]:
        """Until the OPTIONS probes found every worker answering (flags AP), bounded by ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            targets = self.targets()
            if len(targets) == len(self.workers) and all(t.probed_active for t in targets):
                return targets
            if time.monotonic() > deadline:
                raise BalancerError(f"not every worker answered Kamailio's OPTIONS within {within:.0f} s: {targets}")
            time.sleep(0.2)  # probing runs on Kamailio's 1 s timer: there is no event to wait on

    def cpu_s(self) -> float:
        """CPU seconds of the whole process tree so far (a process that has ended counts nothing): from each
        process's ``/proc/PID/schedstat`` (nanoseconds; Kamailio's processes are single-threaded) where Linux has
        it, else from its CPU times, which count in 10 ms ticks, too coarse for a few hundred calls' worth."""
        return sum(_cpu_s(process) for process in self.tree)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.stop(grace=10.0)
        for process in self.tree[1:]:  # the main process ends its children; one left behind is killed here
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    process.kill()


def _cpu_s(process: psutil.Process) -> float:
    try:
        with open(f"/proc/{process.pid}/schedstat") as stat:
            on_cpu_ns = int(stat.read().split()[0])
        if process.is_running():  # the PID is still the process noted at start (psutil checks its start time)
            return on_cpu_ns / 1e9
        return 0.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        times = process.cpu_times()
        return float(times.user + times.system)
    except psutil.Error:
        return 0.0
