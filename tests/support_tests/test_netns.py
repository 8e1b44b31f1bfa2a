"""A private network namespace has its own loopback and cannot reach the host's 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.support.netns import python_call_argv, require_netns, run_in_netns, start_in_netns
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(30)]


def probe_loopback(port: int) -> dict[str, object]:
    """Runs inside the namespace: can it reach the host's listener, and does its own loopback work?"""
    result: dict[str, object] = {}
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            result["host_listener"] = "reached"
    except OSError as error:
        result["host_listener"] = type(error).__name__
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))  # free here even though the host uses it
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
            conn, _ = server.accept()
            client.sendall(b"ping")
            result["own_loopback"] = conn.recv(4).decode()
            conn.close()
    try:
        socket.getaddrinfo("example.com", 80)
        result["dns"] = "resolved"
    except OSError as error:
        result["dns"] = type(error).__name__
    return result


async def test_namespace_is_isolated_from_host_loopback() -> None:
    require_netns()
    port = free_ports(1)[0]
    accepted: list[bool] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(True)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", port)
    async with server:
        outcome = await run_in_netns(python_call_argv(probe_loopback, port), within=20)
        assert outcome.returncode == 0, outcome.stderr
        result = outcome.json()
    assert result["host_listener"] == "ConnectionRefusedError"
    assert result["own_loopback"] == "ping"
    assert result["dns"] != "resolved"
    assert accepted == []


async def test_long_running_process_in_namespace_sees_only_loopback(peer_procs: ProcessGroup) -> None:
    require_netns()
    proc = await start_in_netns(peer_procs, "links", ["sh", "-c", "ip -o link; echo done; sleep 30"], lifetime=10)
    await proc.wait_for_output(r"done", within=10)
    interfaces = [line.split(":")[1].strip() for line in proc.output.splitlines() if ": " in line and "link/" in line]
    assert interfaces == ["lo"]
    await proc.terminate()
    assert not proc.running
