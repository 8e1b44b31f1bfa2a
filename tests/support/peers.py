"""Finding the real third-party peers the end-to-end tests use.

A missing peer skips the test with a clear reason on a developer machine, but fails it under CI=true:
CI must prove the real thing, never silently skip it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(message: str) -> None:
    """Skip the test for a reason outside the project; under CI=true, fail it instead."""
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def _missing(what: str, hint: str) -> None:
    unavailable(f"{what} is not installed ({hint})")


def require_compiler() -> None:
    """What mypyc needs to build (``gateway compile``, ``gateway bench records``)."""
    from gateway.compiled.build import missing_tools

    missing = missing_tools()
    if missing:
        unavailable(f"cannot compile here: missing {', '.join(missing)}")


def require_binary(name: str, *, package: str | None = None) -> str:
    """Path of a system program, or skip (fail under CI) naming the Debian package to install."""
    path = shutil.which(name)
    if path is None:
        _missing(name, f"apt-get install {package or name}; `make test` does this as root")
    assert path is not None
    return path


def require_module(name: str, *, package: str | None = None) -> None:
    """Skip (fail under CI) when a Python module of a peer is missing."""
    if importlib.util.find_spec(name) is None:
        _missing(f"python module {name}", f"pip install {package or name}; `make setup` does this")
