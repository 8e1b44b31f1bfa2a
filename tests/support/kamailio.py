"""Kamailio 5.6 as the SIP dispatcher (load balancer) in front of gateway workers, for tests.

The configuration is the shipped deploy/kamailio/dispatcher.cfg; everything instance-specific (listen
address, dispatcher list file, ctl socket, timers) is passed as pre-processor defines (`-A NAME=VALUE`),
so tests run exactly the file users deploy. Each instance gets its own runtime dir (`-Y`), pid file
(`-P`) and binrpc ctl socket in a temp dir: nothing touches system paths. Kamailio runs in the
foreground (`-DD -E`, log on stderr, captured by the process manager) and is stopped by its PID.

`dispatcher_list()` asks this instance (kamcmd over its own ctl socket) for the state of each worker.
Its flags, as observed with Kamailio 5.6 and `ds_probing_mode 1`: "AX" active but not probed yet (the
state of every worker at start), "AP" active and answering OPTIONS probes, "IP" inactive after a failed
probe or a failure_route `ds_mark_dst("ip")`, "D?" disabled by an operator.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

__all__ = [
    "DEFAULT_CONFIG",
    "DispatcherTarget",
    "KamailioConfigError",
    "KamailioDispatcher",
    "parse_dispatcher_list",
]

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "kamailio" / "dispatcher.cfg"


class KamailioConfigError(RuntimeError):
    """`kamailio -c` rejected the configuration."""


@dataclass(frozen=True, kw_only=True)
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
        """Active and confirmed by an OPTIONS probe (not merely "not failed yet")."""
        return self.flags == "AP"

    @property
    def inactive(self) -> bool:
        return self.flags.startswith(("I", "D"))


_SET = re.compile(r"SET:\s*\{\s*ID:\s*(\d+)")
_DEST = re.compile(r"URI:\s*(\S+)\s+FLAGS:\s*(\S+)")


def parse_dispatcher_list(text: str) -> list[DispatcherTarget]:
    """Targets from `kamcmd dispatcher.list` output (its nested `KEY: value` text form)."""
    targets: list[DispatcherTarget] = []
    sets = list(_SET.finditer(text))
    for index, match in enumerate(sets):
        end = sets[index + 1].start() if index + 1 < len(sets) else len(text)
        for dest in _DEST.finditer(text, match.end(), end):
            targets.append(DispatcherTarget(set_id=int(match.group(1)), uri=dest.group(1), flags=dest.group(2)))
    return targets


class KamailioDispatcher:
    """One Kamailio process dispatching to `workers` (SIP URIs like sip:127.0.0.1:5070) in set 1."""

    def __init__(
        self,
        procs: ProcessGroup,
        workdir: Path,
        *,
        workers: Sequence[str],
        config: Path = DEFAULT_CONFIG,
        name: str = "kamailio",
        children: int = 2,
        fr_timer_ms: int = 2000,
        lifetime: float = 60.0,
        algorithm: int | None = None,
        rate_limit: tuple[int, int] | None = None,
    ) -> None:
        self.name = name
        self.config = Path(config)
        self.workers = list(workers)
        self.runtime_dir = Path(workdir) / name
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        self.list_file = self.runtime_dir / "dispatcher.list"
        self.ctl_socket = self.runtime_dir / "kamailio_ctl"
        self.pid_file = self.runtime_dir / "kamailio.pid"
        self.port = free_ports(1)[0]
        self.children = children
        self.fr_timer_ms = fr_timer_ms
        self.algorithm = algorithm  # None: the config's default (10, call load)
        self.rate_limit = rate_limit  # (requests, per seconds) from one source: WITH_RATELIMIT
        self.lifetime = lifetime
        self.process: ManagedProcess | None = None
        self._procs = procs

    @property
    def uri(self) -> str:
        return f"sip:127.0.0.1:{self.port}"

    def sip_uri(self, user: str) -> str:
        """The URI a caller dials to reach a worker through the balancer."""
        return f"sip:{user}@127.0.0.1:{self.port}"

    def _defines(self) -> list[str]:
        defines = {
            "LISTEN": f"udp:127.0.0.1:{self.port}",
            "DS_LIST": f'"{self.list_file}"',
            "CTL_SOCKET": f'"unix:{self.ctl_socket}"',
            "WORKERS": str(self.children),
            "FR_TIMER": str(self.fr_timer_ms),
        }
        if self.algorithm is not None:
            defines["DS_ALG"] = str(self.algorithm)
        if self.rate_limit is not None:
            requests, window = self.rate_limit
            defines.update(RATELIMIT_REQS=str(requests), RATELIMIT_WINDOW=str(window))
        args = [arg for key, value in defines.items() for arg in ("-A", f"{key}={value}")]
        return [*args, "-A", "WITH_RATELIMIT"] if self.rate_limit is not None else args

    def _write_list(self) -> None:
        # duid names each worker for call-load distribution (see deploy/kamailio/dispatcher.list).
        lines = (f"1 {uri} 0 0 duid=w{index};maxload=0\n" for index, uri in enumerate(self.workers))
        self.list_file.write_text("".join(lines))

    def check_config(self) -> str:
        """Run `kamailio -c` on the config with this instance's defines; its output, or KamailioConfigError."""
        self._write_list()
        argv = ["kamailio", "-c", "-f", str(self.config), "-Y", str(self.runtime_dir), *self._defines()]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        output = result.stdout + result.stderr
        if result.returncode != 0 or "config file ok" not in output:
            raise KamailioConfigError(f"kamailio -c failed ({result.returncode}):\n{output}")
        return output

    async def start(self, *, within: float = 15.0) -> KamailioDispatcher:
        self._write_list()
        argv = [
            "kamailio",
            "-f",
            str(self.config),
            "-DD",
            "-E",
            "-Y",
            str(self.runtime_dir),
            "-P",
            str(self.pid_file),
            *self._defines(),
        ]
        self.process = await self._procs.start(self.name, argv, lifetime=self.lifetime)
        await self.process.wait_for_port(self.port, kind="udp", within=within)
        deadline = time.monotonic() + within
        while True:
            # The ctl socket appears once the ctl module is initialised; kamcmd then answers.
            try:
                await self.dispatcher_list()
                return self
            except KamailioConfigError:
                if time.monotonic() > deadline or not self.process.running:
                    raise
            await asyncio.sleep(0.1)

    async def __aenter__(self) -> KamailioDispatcher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.process is not None:
            await self.process.terminate()

    async def kamcmd(self, *command: str) -> str:
        """Run an RPC command on this instance via kamcmd and its ctl socket."""
        proc = await asyncio.create_subprocess_exec(
            "kamcmd",
            "-s",
            f"unix:{self.ctl_socket}",
            *command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise KamailioConfigError(f"kamcmd {' '.join(command)} hung") from None
        text = out.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise KamailioConfigError(f"kamcmd {' '.join(command)} failed: {text.strip()}")
        return text

    async def dispatcher_list(self) -> list[DispatcherTarget]:
        return parse_dispatcher_list(await self.kamcmd("dispatcher.list"))

    async def wait_target(self, uri: str, *, active: bool, within: float) -> DispatcherTarget:
        """Wait until OPTIONS probing found the worker `uri` answering (flags AP) or not (inactive)."""
        deadline = time.monotonic() + within
        last: list[DispatcherTarget] = []
        while True:
            last = await self.dispatcher_list()
            for target in last:
                if target.uri == uri and (target.probed_active if active else target.inactive):
                    return target
            if time.monotonic() > deadline:
                raise TimeoutError(f"{uri} not {'active' if active else 'inactive'} in {within}s: {last}")
            # Probing runs on Kamailio's 1 s timer; there is no event to wait on, so poll gently.
            await asyncio.sleep(0.2)
