"""bench/ installs as its own distribution and plugs ``gateway bench`` into the ``gateway.commands`` group."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())


def test_the_distribution_declares_the_gateway_bench_command() -> None:
    assert PROJECT["project"]["entry-points"]["gateway.commands"] == {"bench": "bench.command"}
    command = importlib.import_module("bench.command")
    assert callable(command.add_arguments) and callable(command.main) and command.HELP


def test_the_installed_entry_point_is_this_checkouts_bench() -> None:
    [point] = [point for point in entry_points(group="gateway.commands") if point.name == "bench"]
    module = point.load()
    assert Path(module.__file__).resolve() == ROOT / "bench" / "command.py"


def test_every_module_of_the_folder_is_in_the_one_package() -> None:
    # The distribution maps the folder itself to `bench`; a subpackage would need listing beside it.
    assert PROJECT["tool"]["setuptools"] == {"package-dir": {"bench": "."}, "packages": ["bench"]}
    assert not [p for p in (ROOT / "bench").iterdir() if p.is_dir() and (p / "__init__.py").exists()]
