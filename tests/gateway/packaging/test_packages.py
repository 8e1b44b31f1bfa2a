"""What `pip install .` (the Docker image, any non-editable install) puts in place: every package of the tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_gateway_package_is_listed_for_installation() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "gateway").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    missing = sorted(on_disk - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml: an install would lack them"


def test_the_bench_is_not_part_of_the_gateway() -> None:
    # bench/ is a distribution of its own (bench/pyproject.toml, docs/adr/0025): no install of the gateway, the
    # Docker image included, carries it or its dependencies.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = project["tool"]["setuptools"]["packages"]
    assert not [name for name in listed if name == "bench" or name.startswith(("bench.", "gateway.bench"))]
    runtime = {dep.split(">")[0].split("[")[0].split(";")[0].strip() for dep in project["project"]["dependencies"]}
    assert not runtime & {"psutil", "matplotlib", "soxr"}, "the bench's and the plot's dependencies are extras"
    assert project["project"]["optional-dependencies"]["plot"] == ["matplotlib>=3.8"]
    assert "bench" in (ROOT / ".dockerignore").read_text().split()
