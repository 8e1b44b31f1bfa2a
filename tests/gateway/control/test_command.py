"""``gateway control`` as a real process: serves, refuses an insecure bind, stops cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "command-test-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    # The suite's own state dir (tests/conftest.py): the database of calls never lands in the user's home.
    env["GATEWAY_STATE_DIR"] = os.environ["GATEWAY_STATE_DIR"]
    env.update(extra)
    return env


def _wait_healthy(url: str, process: subprocess.Popen[str], deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gateway control exited early: {process.communicate()[1]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError("gateway control did not become healthy")


@pytest.fixture
def control() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "control", "--port", str(port), "--log-level", "info"],
        cwd=ROOT,
        env=_env(GATEWAY_API_TOKEN=TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, process)
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_and_stops_cleanly_even_with_an_open_event_stream(
    control: tuple[str, subprocess.Popen[str]], sig: signal.Signals
) -> None:
    url, process = control
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(url + "/v1/workers", headers=headers).json() == {"items": []}
    assert httpx.get(url + "/v1/workers").status_code == 401
    with httpx.stream("GET", url + "/v1/events", headers=headers, timeout=10) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "retry: 3000"
        process.send_signal(sig)
        rest = list(lines)  # the server ends the stream on shutdown
    assert all(line == "" or line.startswith(":") for line in rest)
    _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "API token required" in stderr
    assert "shutting down" in stderr


def test_refuses_a_public_bind_without_a_token() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "control", "--host", "0.0.0.0", "--port", str(_free_port())],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0" in result.stderr and "GATEWAY_API_TOKEN" in result.stderr


def test_bad_config_file_exits_2_with_the_problem(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[[routes]]\nname = 'a'\ndid = '*'\nprofile = 'nope'\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "control", "--port", str(_free_port()), "--config", str(config)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert f"{config}: routes[0].profile: unknown profile 'nope'" in result.stderr


def test_without_a_token_it_warns_that_auth_is_off() -> None:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "control", "--port", str(port)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", process)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/workers").status_code == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
        assert process.returncode == 0
        assert "authentication is OFF" in stderr and "loopback" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
