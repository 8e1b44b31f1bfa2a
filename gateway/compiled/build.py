"""``gateway compile``: build :data:`gateway.compiled.MODULES` with mypyc into a directory with a manifest.

Needs what mypyc needs: mypy (the ``test`` extra, or ``pip install mypy``), setuptools and a C compiler with the
Python headers. The sources are type-checked first (mypyc compiles only code mypy accepts); the build is made in
a temporary directory and only the extensions and ``manifest.json`` land in ``out``.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.compiled import FORMAT, GROUP, MANIFEST, MODULES, PACKAGE_ROOT, digest, source_path


class BuildError(RuntimeError):
    """The compiled build could not be made; the message says what is missing or what failed."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    out: Path
    modules: int
    seconds: float


def missing_tools() -> list[str]:
    """What this machine lacks to build (empty when it can)."""
    missing = []
    for module in ("mypyc", "setuptools"):
        if importlib.util.find_spec(module) is None:
            missing.append(f"the {module} package")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        missing.append(f"a C compiler ({compiler})")
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        missing.append(f"the Python headers ({include})")
    return missing


def _mypy_config(work: Path) -> Path:
    # Not strict: mypyc needs the code type-correct, which `make lint` checks strictly; the strict extras
    # (Any from a library without stubs, say) would only make the build depend on which stubs are installed.
    # telcodecs is the installed name of codecs/ (ARCHITECTURE.md: the import-name trap): mypy finds it through
    # a directory holding a link under its import name, wherever the package is installed.
    import telcodecs

    shim = work / "shim"
    shim.mkdir()
    (shim / "telcodecs").symlink_to(Path(telcodecs.__file__).resolve().parent, target_is_directory=True)
    config = work / "mypy.ini"
    config.write_text(
        "[mypy]\n"
        f"python_version = {sys.version_info.major}.{sys.version_info.minor}\n"
        f"mypy_path = {shim}\n"
        f"cache_dir = {work / 'mypy-cache'}\n"
        "ignore_missing_imports = True\n"
    )
    return config


def build(out: Path, modules: tuple[str, ...] = MODULES, *, quiet: bool = True) -> BuildResult:
    missing = missing_tools()
    if missing:
        raise BuildError("cannot compile here: missing " + ", ".join(missing))
    from mypyc.build import mypycify
    from setuptools import Distribution

    started = time.monotonic()
    out = out.resolve()
    sources = [source_path(name) for name in modules]
    absent = [str(path) for path in sources if not path.is_file()]
    if absent:
        raise BuildError(f"no source for {', '.join(absent)} (compile from a tree or an install with .py files)")
    with tempfile.TemporaryDirectory(prefix="gateway-compile-") as tmp:
        work = Path(tmp)
        config = _mypy_config(work)
        # A copy of the package to compile from: the directory that holds the installed package may hold other
        # modules too (site-packages holds mypy_extensions, which mypy refuses to see as a user module).
        tree = work / "src"
        shutil.copytree(
            PACKAGE_ROOT / "gateway", tree / "gateway", ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
        relative = [str(path.relative_to(PACKAGE_ROOT)) for path in sources]
        staging = work / "lib"
        log = work / "build.log"
        try:
            with contextlib.chdir(tree), _output_to(log if quiet else None):
                extensions = mypycify(
                    ["--config-file", str(config), *relative],
                    opt_level="3",
                    group_name=GROUP,
                    target_dir=str(work / "c"),
                )
                dist = Distribution({"name": "gateway-compiled", "ext_modules": extensions})
                dist.script_args = ["build_ext", "--build-lib", str(staging), "--build-temp", str(work / "obj")]
                dist.parse_command_line()
                dist.run_commands()
        except (SystemExit, Exception) as exc:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise BuildError(f"mypyc build failed ({exc!r}):\n{tail}") from None
        entries = []
        for name, source in zip(modules, sources, strict=True):
            entries.append(
                {
                    "name": name,
                    "file": _extension(staging, name).relative_to(staging).as_posix(),
                    "source": source.relative_to(PACKAGE_ROOT).as_posix(),
                    "sha256": digest(tree / source.relative_to(PACKAGE_ROOT)),  # the copy that was compiled
                }
            )
        support_name = GROUP + "__mypyc"
        support = {support_name: _extension(staging, support_name).relative_to(staging).as_posix()}
        manifest = {
            "format": FORMAT,
            "cache_tag": sys.implementation.cache_tag,
            "python": sys.version.split()[0],
            "modules": entries,
            "support": support,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, out)
    return BuildResult(out=out, modules=len(modules), seconds=time.monotonic() - started)


def _extension(staging: Path, name: str) -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    path = staging.joinpath(*name.split(".")).with_name(name.rsplit(".", 1)[-1] + suffix)
    if not path.is_file():
        raise BuildError(f"the build did not produce {path.name} for {name}")
    return path


@contextlib.contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """Send the compiler's chatter (file descriptors 1 and 2, which gcc inherits) to ``path``."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
