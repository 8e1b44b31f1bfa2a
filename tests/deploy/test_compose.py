"""docker-compose.yml: validated by the Compose client where one is installed, and read with PyYAML always.

No Docker engine runs here, so nothing is started; the file is checked against what it wires together: the
gateway commands parse with the real CLI, the fake provider is where the workers' GATEWAY_OPENAI_URL points,
the workers' ids, ports and RTP ranges do not collide on the shared host network, Kamailio's dispatcher list
names the workers' SIP ports, and every service has a health check that a later one waits on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser
from gateway.commands import worker_args
from gateway.control.config import load_config
from tests.deploy import support as s
from tests.support.peers import unavailable

GATEWAY_SERVICES = ("fake-provider", "control", "worker1", "worker2")
WORKERS = ("worker1", "worker2")
TOKEN = "compose-test-token-0123456789"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?message}, with the caller's environment ``env``."""

    def replace(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise ValueError(f"{name}: {arg}")
        return ""

    return _INTERPOLATION.sub(replace, value)


def services(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    env = {"GATEWAY_API_TOKEN": TOKEN} if env is None else env
    loaded: dict[str, dict[str, Any]] = s.load_yaml_documents(s.COMPOSE)[0]["services"]

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return interpolate(node, env)
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        return node

    resolved: dict[str, dict[str, Any]] = walk(loaded)
    return resolved


def gateway_args(service: dict[str, Any]) -> Any:
    return build_parser().parse_args([str(arg) for arg in service["command"]])


def test_the_services_of_the_demo_on_the_host_network() -> None:
    found = services()
    assert set(found) == {"redis", "kamailio", *GATEWAY_SERVICES}
    for name, service in found.items():
        assert service["network_mode"] == "host", f"{name}: media must reach the workers directly"
    for name in GATEWAY_SERVICES:
        assert found[name]["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}, name
        assert found[name]["image"] == "voice-gateway", "one image for every gateway role"


def test_every_service_has_a_health_check_and_waits_for_those_it_needs() -> None:
    found = services()
    for name, service in found.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
    needs = {
        "control": {"redis"},
        "worker1": {"control", "fake-provider"},
        "worker2": {"control", "fake-provider"},
        "kamailio": {"worker1", "worker2"},
    }
    for name, wanted in needs.items():
        depends = found[name]["depends_on"]
        assert set(depends) == wanted, name
        assert all(condition == {"condition": "service_healthy"} for condition in depends.values()), name


def test_the_demo_runs_the_openai_path_against_the_fake_provider() -> None:
    found = services()
    fake = gateway_args(found["fake-provider"])
    assert fake.command == "fake-provider" and fake.host == "127.0.0.1"
    for name in WORKERS:
        env = found[name]["environment"]
        assert env["GATEWAY_PROVIDER"] == "openai"
        assert env["GATEWAY_OPENAI_URL"] == f"ws://{fake.host}:{fake.port}/v1/realtime"
        assert env["OPENAI_API_KEY"] == "", "no key: the gateway needs none for a loopback provider URL"
    # With the caller's own URL and key the same file talks to OpenAI.
    real = services({"GATEWAY_API_TOKEN": TOKEN, "GATEWAY_OPENAI_URL": "wss://api.openai.com/v1/realtime"})
    assert real["worker1"]["environment"]["GATEWAY_OPENAI_URL"] == "wss://api.openai.com/v1/realtime"
    health = found["fake-provider"]["healthcheck"]["test"]
    assert f"('127.0.0.1', {fake.port})" in health[-1]


def test_the_api_token_is_required() -> None:
    with pytest.raises(ValueError, match="GATEWAY_API_TOKEN"):
        services({})


def test_workers_ids_ports_and_rtp_ranges_do_not_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    found = services()
    control_env = found["control"]["environment"]
    taken = {
        int(control_env["GATEWAY_HTTP_PORT"]): "control http",
        int(found["redis"]["command"][found["redis"]["command"].index("--port") + 1]): "redis",
        gateway_args(found["fake-provider"]).port: "fake provider",
        5060: "kamailio",
    }
    ids, ranges = set(), []
    for name in WORKERS:
        args = gateway_args(found[name])
        assert args.command == "worker" and args.control == f"http://127.0.0.1:{control_env['GATEWAY_HTTP_PORT']}"
        for key, value in found[name]["environment"].items():
            monkeypatch.setenv(key, value)
        settings = worker_args.worker_settings(args)
        ids.add(settings.worker_id)
        for port, what in ((settings.sip.sip_port, "sip"), (args.api_port, "api")):
            assert port not in taken, f"{name} {what} port {port} is taken by {taken.get(port)}"
            taken[port] = f"{name} {what}"
        ranges.append(settings.media.rtp_port_bounds)
        health = found[name]["healthcheck"]["test"]
        assert int(health[-1]) == settings.sip.sip_port, f"{name}'s health check connects to its own SIP port"
        assert settings.sip.public_host == "127.0.0.1" and settings.sip.sip_host == "0.0.0.0"
    assert ids == set(WORKERS)
    (_, first_high), (second_low, _) = sorted(ranges)
    assert first_high < second_low, "RTP ranges overlap"
    for port in taken:
        assert not any(low <= port <= high for low, high in ranges), f"port {port} inside an RTP range"


def test_the_public_host_moves_kamailio_and_what_the_workers_advertise() -> None:
    found = services({"GATEWAY_API_TOKEN": TOKEN, "GATEWAY_PUBLIC_HOST": "198.51.100.7"})
    assert "LISTEN=udp:198.51.100.7:5060" in found["kamailio"]["command"]
    assert {found[w]["environment"]["GATEWAY_ADVERTISED_HOST"] for w in WORKERS} == {"198.51.100.7"}


def test_kamailio_runs_the_shipped_config_in_the_foreground_and_lists_the_workers() -> None:
    found = services()
    kamailio = found["kamailio"]
    argv = [*kamailio["entrypoint"], *kamailio["command"]]
    assert argv[:3] == ["kamailio", "-DD", "-E"] and argv.count("-DD") == 1, "-DD twice would daemonize"
    assert kamailio["volumes"] == ["./deploy/kamailio:/etc/kamailio:ro"]
    assert argv[argv.index("-f") + 1] == "/etc/kamailio/dispatcher.cfg"
    cfg = (s.DEPLOY / "kamailio" / "dispatcher.cfg").read_text()
    declared = set(re.findall(r"^#!trydef\s+(\w+)", cfg, re.MULTILINE))
    defines = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-A")
    assert set(defines) <= declared
    socket_path = defines["CTL_SOCKET"].strip('"').removeprefix("unix:")
    assert Path(socket_path).parent.as_posix() in kamailio["tmpfs"], "the ctl socket on a writable tmpfs"
    assert kamailio["healthcheck"]["test"] == ["CMD", "kamcmd", "-s", f"unix:{socket_path}", "core.uptime"]
    assert int(kamailio["user"].split(":")[0]) > 0, "not root"

    listed = (s.DEPLOY / "kamailio" / "dispatcher.list").read_text().split("\n")
    entries = {line.split()[1] for line in listed if line.strip() and not line.startswith("#")}
    ports = {gateway_args(found[name]).sip_port for name in WORKERS}
    assert entries == {f"sip:127.0.0.1:{port}" for port in ports}


def test_control_plane_reads_the_example_routes_from_redis_backed_state() -> None:
    found = services()
    control = found["control"]
    env = control["environment"]
    mount, records, recordings = control["volumes"]
    source, target, mode = mount.split(":")
    assert target == env["GATEWAY_CONFIG"] and mode == "ro"
    # The database of calls outlives the container: a named volume at the image's GATEWAY_STATE_DIR.
    volume, state_dir = records.split(":")
    assert volume in s.load_yaml_documents(s.COMPOSE)[0]["volumes"] and state_dir == "/var/lib/gateway"
    # The workers' recordings: one named volume the plane and every worker mount at the image's recordings dir.
    for name in ("control", *WORKERS):
        assert recordings in found[name]["volumes"]
    assert recordings == "recordings:/var/lib/gateway/recordings"
    config = load_config(str(s.REPO / source))
    assert config.routes, "the example routes load"
    redis_port = found["redis"]["command"][found["redis"]["command"].index("--port") + 1]
    assert env["GATEWAY_REDIS_URL"] == f"redis://127.0.0.1:{redis_port}/0"
    assert env["GATEWAY_HTTP_HOST"] == "0.0.0.0" and env["GATEWAY_API_TOKEN"] == TOKEN


def test_env_names_are_settings_the_gateway_reads() -> None:
    known = s.gateway_env_names() | s.PENDING_SETTINGS
    for name in GATEWAY_SERVICES:
        unknown = set(services()[name].get("environment", {})) - known
        assert not unknown, f"{name}: {sorted(unknown)} are not settings"


def _compose_client() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_the_compose_client_validates_the_file() -> None:
    client = _compose_client()
    if client is None:
        unavailable("no Compose client (`docker compose` plugin or Debian's docker-compose; `make test` installs it)")
    assert client is not None
    env = {**os.environ, "GATEWAY_API_TOKEN": TOKEN}
    argv = [*client, "-f", str(s.COMPOSE), "config", "-q"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=s.REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    env.pop("GATEWAY_API_TOKEN")
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=s.REPO)
    assert refused.returncode != 0 and "GATEWAY_API_TOKEN" in refused.stdout + refused.stderr
