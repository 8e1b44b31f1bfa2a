"""Kamailio 5.6 in tests: the SIP dispatcher (load balancer) in front of gateway workers, and a registrar.

`KamailioDispatcher` runs the shipped deploy/kamailio/dispatcher.cfg; `KamailioRegistrar` runs
tests/support/kamailio-registrar.cfg, a registrar with digest authentication (one fixed account, no
database) that relays calls for an AOR to its registered contacts, as a carrier trunk that delivers calls
only to registered contacts does. Everything instance-specific (listen address, ctl socket, timers, the
account) is passed as pre-processor defines (`-A NAME=VALUE`), so tests run the files as they are. Each
instance gets its own runtime dir (`-Y`), pid file (`-P`) and binrpc ctl socket in a temp dir: nothing
touches system paths. Kamailio runs in the foreground (`-DD -E`, log on stderr, captured by the process
manager) and is stopped by its PID.

`dispatcher_list()` asks this instance (kamcmd over its own ctl socket) for the state of each worker.
Its flags, as observed with Kamailio 5.6 and `ds_probing_mode 1`: "AX" active but not probed yet (the
state of every worker at start), "AP" active and answering OPTIONS probes, "IP" inactive after a failed
probe or a failure_route `ds_mark_dst("ip")`, "D?" disabled by an operator.

`KamailioRegistrar.bindings()` asks its instance for the location table (`kamcmd ul.dump`): each contact with
its AOR, remaining seconds, Call-ID, CSeq and RFC 5626 instance.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from bench.kamailio import (
    DispatcherTarget,
    define_args,
    dispatcher_defines,
    dispatcher_list_text,
    parse_dispatcher_list,
)
from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

__all__ = [
    "DEFAULT_CONFIG",
    "REGISTRAR_CONFIG",
    "Binding",
    "DispatcherTarget",
    "KamailioConfigError",
    "KamailioDispatcher",
    "KamailioRegistrar",
    "parse_dispatcher_list",
    "parse_ul_dump",
]

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "kamailio" / "dispatcher.cfg"
REGISTRAR_CONFIG = Path(__file__).resolve().with_name("kamailio-registrar.cfg")


class KamailioConfigError(RuntimeError):
    """`kamailio -c` rejected the configuration."""


class KamailioProcess:
    """One Kamailio process on a free loopback UDP port, with its own runtime dir and ctl socket."""

    def __init__(self, procs: ProcessGroup, workdir: Path, *, config: Path, name: str, lifetime: float) -> None:
        self.name = name
        self.config = Path(config)
        self.runtime_dir = Path(workdir) / name
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        self.ctl_socket = self.runtime_dir / "kamailio_ctl"
        self.pid_file = self.runtime_dir / "kamailio.pid"
        self.port = free_ports(1)[0]
        self.lifetime = lifetime
        self.process: ManagedProcess | None = None
        self._procs = procs

    @property
    def uri(self) -> str:
        return f"sip:127.0.0.1:{self.port}"

    def sip_uri(self, user: str) -> str:
        """The URI a caller dials to reach `user` through this instance."""
        return f"sip:{user}@127.0.0.1:{self.port}"

    def _defines(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write whatever files the defines point at (before a check or a start)."""

    async def _ready(self) -> None:
        """Raise KamailioConfigError until the instance answers its ctl socket."""
        await self.kamcmd("core.uptime")

    def check_config(self) -> str:
        """Run `kamailio -c` on the config with this instance's defines; its output, or KamailioConfigError."""
        self._prepare()
        argv = ["kamailio", "-c", "-f", str(self.config), "-Y", str(self.runtime_dir), *self._defines()]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        output = result.stdout + result.stderr
        if result.returncode != 0 or "config file ok" not in output:
            raise KamailioConfigError(f"kamailio -c failed ({result.returncode}):\n{output}")
        return output

    async def start(self, *, within: float = 15.0) -> Self:
        self._prepare()
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
                await self._ready()
                return self
            except KamailioConfigError:
                if time.monotonic() > deadline or not self.process.running:
                    raise
            await asyncio.sleep(0.1)

    async def __aenter__(self) -> Self:
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


class KamailioDispatcher(KamailioProcess):
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
        super().__init__(procs, workdir, config=config, name=name, lifetime=lifetime)
        self.workers = list(workers)
        self.list_file = self.runtime_dir / "dispatcher.list"
        self.children = children
        self.fr_timer_ms = fr_timer_ms
        self.algorithm = algorithm  # None: the config's default (10, call load)
        self.rate_limit = rate_limit  # (requests, per seconds) from one source: WITH_RATELIMIT

    def _defines(self) -> list[str]:
        defines = dispatcher_defines(
            port=self.port,
            list_file=self.list_file,
            ctl_socket=self.ctl_socket,
            children=self.children,
            fr_timer_ms=self.fr_timer_ms,
        )
        if self.algorithm is not None:
            defines["DS_ALG"] = str(self.algorithm)
        if self.rate_limit is not None:
            requests, window = self.rate_limit
            defines.update(RATELIMIT_REQS=str(requests), RATELIMIT_WINDOW=str(window))
        args = define_args(defines)
        return [*args, "-A", "WITH_RATELIMIT"] if self.rate_limit is not None else args

    def _write_list(self) -> None:
        self.list_file.write_text(dispatcher_list_text(self.workers))

    def _prepare(self) -> None:
        self._write_list()

    async def _ready(self) -> None:
        await self.dispatcher_list()

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


@dataclass(frozen=True, kw_only=True)
class Binding:
    """One contact in Kamailio's location table (`kamcmd ul.dump`)."""

    aor: str
    address: str
    expires: int | None  # seconds left (None: permanent, or being deleted)
    call_id: str
    cseq: int
    instance: str | None  # the +sip.instance, angle brackets kept


_AOR = re.compile(r"^\s*AoR:\s*(\S+)\s*$", re.MULTILINE)
_CONTACT_FIELD = re.compile(r"^\s*(Address|Expires|Call-ID|CSeq|Instance):\s*(.*?)\s*$", re.MULTILINE)


def parse_ul_dump(text: str) -> list[Binding]:
    """Bindings from `kamcmd ul.dump` output (its nested `Key: value` text form)."""
    bindings: list[Binding] = []
    aors = list(_AOR.finditer(text))
    for index, match in enumerate(aors):
        end = aors[index + 1].start() if index + 1 < len(aors) else len(text)
        block = text[match.end() : end]
        for contact in block.split("Contact: {")[1:]:
            fields = dict(_CONTACT_FIELD.findall(contact))
            expires = fields.get("Expires", "")
            instance = fields.get("Instance", "")
            bindings.append(
                Binding(
                    aor=match.group(1),
                    address=fields.get("Address", ""),
                    expires=int(expires) if expires.isdigit() else None,
                    call_id=fields.get("Call-ID", ""),
                    cseq=int(fields.get("CSeq", "0") or 0),
                    instance=None if instance in ("", "[not set]") else instance,
                )
            )
    return bindings


class KamailioRegistrar(KamailioProcess):
    """A registrar on loopback, UDP and TCP on one port (tests/support/kamailio-registrar.cfg), for one account:
    `auth_user` with `auth_password` in `realm`, expiries kept within [min_expires, max_expires] (423 below),
    nonces stale after `nonce_expire` seconds. Out-of-dialog requests to a registered AOR go to its contacts."""

    def __init__(
        self,
        procs: ProcessGroup,
        workdir: Path,
        *,
        realm: str = "registrar.test",
        auth_user: str = "gateway-auth",
        auth_password: str = "secret",
        min_expires: int = 4,
        max_expires: int = 10,
        nonce_expire: int = 300,
        name: str = "registrar",
        children: int = 2,
        lifetime: float = 120.0,
        config: Path = REGISTRAR_CONFIG,
    ) -> None:
        super().__init__(procs, workdir, config=config, name=name, lifetime=lifetime)
        self.realm = realm
        self.auth_user = auth_user
        self.auth_password = auth_password
        self.min_expires = min_expires
        self.max_expires = max_expires
        self.nonce_expire = nonce_expire
        self.children = children

    def _defines(self) -> list[str]:
        defines = {
            "LISTEN": f"udp:127.0.0.1:{self.port}",
            "LISTEN_TCP": f"tcp:127.0.0.1:{self.port}",
            "CTL_SOCKET": f'"unix:{self.ctl_socket}"',
            "WORKERS": str(self.children),
            "REALM": f'"{self.realm}"',
            "AUTH_USER": f'"{self.auth_user}"',
            "AUTH_PASSWORD": f'"{self.auth_password}"',
            "MIN_EXPIRES": str(self.min_expires),
            "MAX_EXPIRES": str(self.max_expires),
            "NONCE_EXPIRE": str(self.nonce_expire),
        }
        return define_args(defines)

    async def bindings(self, aor_user: str | None = None) -> list[Binding]:
        """The location table now (only `aor_user`'s contacts when given)."""
        found = parse_ul_dump(await self.kamcmd("ul.dump"))
        return [b for b in found if aor_user is None or b.aor == aor_user]

    async def wait_bindings(
        self, aor_user: str, predicate: Callable[[list[Binding]], bool], *, within: float, what: str
    ) -> list[Binding]:
        """Poll the location table until `predicate` holds for `aor_user`'s contacts (usrloc has no events)."""
        deadline = time.monotonic() + within
        while True:
            current = await self.bindings(aor_user)
            if predicate(current):
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {within} s; bindings of {aor_user}: {current}")
            await asyncio.sleep(0.1)
