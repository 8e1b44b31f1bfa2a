"""Private network namespaces for hostile-input tests: only a loopback interface, nothing routes out.

Torture and fuzzed SIP carries addresses like 192.0.2.x, 2001:db8:: or example.com; a gateway that
answered or resolved them would send packets off the machine. Run it (and its test driver) inside
`unshare -n`, where `ip link set lo up` gives a fresh 127.0.0.1 and there is no other interface: the
namespace's loopback is not the host's, so it can reach nothing outside the namespace at all.

Needs root (or user namespaces); `require_netns()` skips locally and fails under CI=true when `unshare -n`
is not permitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.peers import require_binary, unavailable
from tests.support.procs import ManagedProcess, ProcessGroup

__all__ = [
    "NetnsResult",
    "netns_argv",
    "netns_available",
    "python_call_argv",
    "require_netns",
    "run_in_netns",
    "run_scenario_in_netns",
    "start_in_netns",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# Bring up the namespace's own loopback, then become the command (so its PID is the one we stop).
_BOOTSTRAP = 'ip link set lo up && exec "$@"'


@functools.cache
def netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        result = subprocess.run(
            ["unshare", "-n", "--", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def require_netns() -> None:
    """Skip (fail under CI=true) when private network namespaces cannot be created here."""
    require_binary("unshare", package="util-linux")
    require_binary("ip", package="iproute2")
    if not netns_available():
        unavailable("`unshare -n` is not permitted here (needs root or user namespaces)")


def netns_argv(argv: Sequence[str]) -> list[str]:
    """`argv` wrapped to run in a new network namespace with its loopback up."""
    return ["unshare", "-n", "--", "sh", "-c", _BOOTSTRAP, "netns", *argv]


def python_call_argv(func: Callable[..., Any], *args: Any) -> list[str]:
    """argv that runs `func(*args)` (an importable module-level function, JSON-able args) in a new
    interpreter and prints its JSON-able return value as the last line of stdout."""
    module, name = func.__module__, func.__qualname__
    if "<" in name or module == "__main__":
        raise ValueError(f"{func!r} must be a module-level function of an importable module")
    code = (
        "import importlib, json, sys; "
        f"f = getattr(importlib.import_module({module!r}), {name!r}); "
        "print(json.dumps(f(*json.loads(sys.argv[1]))))"
    )
    return [sys.executable, "-c", code, json.dumps(list(args))]


@dataclass(frozen=True, kw_only=True)
class NetnsResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """The last stdout line as JSON (what a `python_call_argv` function returned)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


async def run_in_netns(argv: Sequence[str], *, within: float = 30.0, cwd: Path = REPO_ROOT) -> NetnsResult:
    """Run `argv` to completion in a private network namespace; killed by PID after `within` seconds."""
    proc = await asyncio.create_subprocess_exec(
        *netns_argv(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"{list(argv)} in a network namespace ran longer than {within}s") from None
    assert proc.returncode is not None
    return NetnsResult(returncode=proc.returncode, stdout=out.decode(), stderr=err.decode())


async def start_in_netns(
    procs: ProcessGroup, name: str, argv: Sequence[str], *, lifetime: float, cwd: Path = REPO_ROOT
) -> ManagedProcess:
    """Start a long-running `argv` (e.g. a gateway plus its test driver) in its own network namespace."""
    return await procs.start(name, netns_argv(argv), lifetime=lifetime, cwd=cwd)


def _netns_of(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/net")
    return None


def _kill_namespace(netns: str | None) -> None:
    """SIGKILL whatever is still running in a scenario's namespace: only processes it started live there."""
    if netns is None or netns == _netns_of(os.getpid()):
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _netns_of(int(entry)) == netns:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


async def run_scenario_in_netns(
    procs: ProcessGroup, name: str, argv: Sequence[str], *, within: float, prefix: str
) -> dict[str, Any]:
    """Run a scenario process in its own namespace to its end (killing what it leaves there) and return the JSON
    report it printed on its last line starting with ``prefix``; the report says where the scenario's log is."""
    scenario = await start_in_netns(procs, name, argv, lifetime=within)
    own = _netns_of(os.getpid())
    deadline = time.monotonic() + 10
    # `unshare` enters the new namespace right after it starts; nothing signals that but /proc.
    while (netns := _netns_of(scenario.pid)) == own and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    try:
        await scenario.wait(within=within)
    finally:
        await scenario.terminate()
        _kill_namespace(netns)
    lines = [line for line in scenario.output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise AssertionError(f"the scenario printed no report; log: {scenario.log_path}\n{scenario.output[-3000:]}")
    report: dict[str, Any] = json.loads(lines[-1][len(prefix) :])
    report["scenario_log"] = str(scenario.log_path)
    return report
