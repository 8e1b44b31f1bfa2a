"""A real mypyc build of the media plane, and the media tests run again on it.

The build takes 1–2 minutes; it is made once for this module. It needs a C compiler (skips locally without one,
fails under CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.compiled import ENV, MODULES, PACKAGE_ROOT
from tests.support.peers import require_compiler

# The build alone ran past pytest's default 300 s on a loaded 2-core machine (it is one mypyc compile of every
# module): the module's own subprocess timeouts bound it instead.
pytestmark = pytest.mark.timeout(1200)

# The tests of every compiled module's behaviour, plus the end-to-end load test (gateway run as a subprocess
# inherits GATEWAY_COMPILED: 30 calls whose echoed audio must come back right).
SUITES = [
    "tests/gateway/media",
    "tests/gateway/session",
    "tests/gateway/transport/test_rtp_socket.py",
    "tests/gateway/transport/test_clock.py",
    "tests/gateway/providers",
    "tests/gateway/worker",
    "tests/e2e/test_loadtest.py",
]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_compiler()
    out = tmp_path_factory.mktemp("compiled") / "build"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "compile", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(None),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"compiled {len(MODULES)} modules into {out}" in done.stdout
    return out


def _env(build: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if build is not None:
        env[ENV] = str(build)
    return env


def _python(code: str, build: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(build), cwd=PACKAGE_ROOT
    )


def test_every_module_loads_from_the_build(build: Path) -> None:
    imports = "; ".join(f"import {name}" for name in MODULES)
    done = _python(f"{imports}; import gateway.compiled as c; print(c.status())", build)
    assert done.returncode == 0, done.stderr
    assert f"compiled ({len(MODULES)} of {len(MODULES)} modules loaded from {build})" in done.stdout
    origins = _python(
        f"{imports}; import sys; print([sys.modules[n].__spec__.origin for n in {list(MODULES)!r}])", build
    )
    assert all(path.startswith(str(build)) and path.endswith(".so") for path in eval(origins.stdout))


def test_a_stale_build_stops_the_import_and_says_how_to_rebuild(build: Path, tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    shutil.copytree(build, stale, symlinks=True)
    manifest = json.loads((stale / "manifest.json").read_text())
    manifest["modules"][0]["sha256"] = "f" * 64  # as if the source had been edited after the build
    (stale / "manifest.json").write_text(json.dumps(manifest))
    done = _python("import gateway", stale)
    assert done.returncode != 0
    source = manifest["modules"][0]["source"]
    assert "CompiledBuildError" in done.stderr and f"stale: {source} changed" in done.stderr
    assert f"gateway compile --out {stale}" in done.stderr


def test_the_media_tests_pass_on_the_build(build: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *SUITES],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(build),
        cwd=PACKAGE_ROOT,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_records_built_per_packet_or_frame_are_native_in_the_build(build: Path) -> None:
    # A NamedTuple or a frozen dataclass would be built through interpreted code on every packet or frame
    # (gateway bench records: 0.3-0.45 and 1.2-2 µs more per RTP packet).
    code = (
        "import gateway.compiled as c; from bench.records import interpreted_constructor; "
        "from gateway.media.rtp import RtpPacket; from gateway.media.tick import G711Frame; "
        "from gateway.session.playout import G711Codes; "
        "print(c.status()); print([interpreted_constructor(k) for k in (RtpPacket, G711Frame, G711Codes)])"
    )
    done = _python(code, build)
    assert done.returncode == 0, done.stderr
    status, flags = done.stdout.strip().splitlines()
    assert status.startswith("media plane: compiled (")
    assert flags == "[False, False, False]"
