"""The process manager: readiness with deadlines, lifetimes, stop by PID (whole group), free ports."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.procs import (
    PortAllocator,
    ProcessExitedError,
    ProcessGroup,
    ReadinessTimeoutError,
    free_ports,
    port_is_bound,
)

pytestmark = pytest.mark.timeout(30)


async def test_output_readiness_and_log_file(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("echo", ["sh", "-c", "echo starting; echo ready on 1234; sleep 20"], lifetime=10)
        match = await proc.wait_for_output(r"ready on (\d+)", within=5)
        assert match.group(1) == "1234"
        assert proc.running
    assert not proc.running
    assert "ready on 1234" in proc.log_path.read_text()


async def test_waiting_for_output_that_never_comes_times_out(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("quiet", ["sleep", "20"], lifetime=10)
        with pytest.raises(ReadinessTimeoutError, match=r"quiet\.log"):
            await proc.wait_for_output("never", within=0.3)


async def test_a_process_that_exits_early_is_reported(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("crash", ["sh", "-c", "echo boom; exit 3"], lifetime=10)
        with pytest.raises(ProcessExitedError, match="exited with 3"):
            await proc.wait_for_output("ready", within=5)
        assert await proc.wait(within=5) == 3


async def test_lifetime_ends_a_hung_process(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("hung", ["sleep", "60"], lifetime=0.5)
        returncode = await proc.wait(within=5)
        assert returncode != 0
        assert "lifetime of 0.5s is over" in proc.log_path.read_text()


async def test_terminate_stops_children_that_ignore_sigterm(tmp_path: Path) -> None:
    script = "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + (
        "child = subprocess.Popen(['sleep', '60']); print('child', child.pid, flush=True); time.sleep(60)"
    )
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("stubborn", [sys.executable, "-c", script], lifetime=20)
        child_pid = int((await proc.wait_for_output(r"child (\d+)", within=5)).group(1))
        await proc.terminate(grace=0.5)
        assert not proc.running
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE


async def test_tcp_and_udp_port_readiness(tmp_path: Path) -> None:
    tcp_port, udp_port = free_ports(2)
    code = (
        "import socket, time; "
        f"t = socket.socket(); t.bind(('127.0.0.1', {tcp_port})); t.listen(); "
        f"u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', {udp_port})); "
        "time.sleep(20)"
    )
    async with ProcessGroup(tmp_path) as procs:
        proc = await procs.start("binder", [sys.executable, "-c", code], lifetime=10)
        await proc.wait_for_port(tcp_port, within=5)
        await proc.wait_for_port(udp_port, kind="udp", within=5)
        assert port_is_bound(udp_port, kind="udp")


def test_port_blocks_are_free_distinct_and_consecutive() -> None:
    allocator = PortAllocator(20000, 20400)
    blocks = [allocator.block(12) for _ in range(10)]
    flat = [p for block in blocks for p in block]
    assert len(flat) == len(set(flat))
    for block in blocks:
        assert block == list(range(block[0], block[0] + 12))
        assert not any(port_is_bound(p, kind="udp") or port_is_bound(p, kind="tcp") for p in block)


def test_a_bound_port_is_never_handed_out() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        taken = sock.getsockname()[1]
        allocator = PortAllocator(taken, taken + 2)
        with pytest.raises(RuntimeError, match="no block"):
            allocator.block(1)


def test_group_ids_are_the_pids(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        async with ProcessGroup(tmp_path) as procs:
            proc = await procs.start("pg", ["sleep", "10"], lifetime=5)
            return proc.pid, os.getpgid(proc.pid)

    pid, pgid = asyncio.run(scenario())
    assert pid == pgid
