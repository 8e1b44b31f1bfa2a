"""The compiled build's manifest checks and finder (no compiler needed)."""

from __future__ import annotations

import importlib.machinery
import json
import sys
from pathlib import Path

import pytest

from gateway.compiled import (
    FORMAT,
    MODULES,
    PACKAGE_ROOT,
    CompiledBuildError,
    _Finder,
    digest,
    read_manifest,
    source_path,
)


def _write_build(directory: Path, *, tag: str | None = None, sha: str | None = None) -> Path:
    """A build directory whose manifest describes gateway.media.jitter (the extension is a placeholder file)."""
    name = "gateway.media.jitter"
    extension = directory / "gateway" / "media" / "jitter.so"
    extension.parent.mkdir(parents=True)
    extension.write_bytes(b"")
    support = directory / "gateway" / "_compiled__mypyc.so"
    support.write_bytes(b"")
    source = source_path(name)
    manifest = {
        "format": FORMAT,
        "cache_tag": tag or sys.implementation.cache_tag,
        "modules": [
            {
                "name": name,
                "file": "gateway/media/jitter.so",
                "source": source.relative_to(PACKAGE_ROOT).as_posix(),
                "sha256": sha or digest(source),
            }
        ],
        "support": {"gateway._compiled__mypyc": "gateway/_compiled__mypyc.so"},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_a_build_matching_the_sources_is_read(tmp_path: Path) -> None:
    manifest = read_manifest(_write_build(tmp_path))
    assert [m.name for m in manifest.modules] == ["gateway.media.jitter"]
    assert manifest.files()["gateway._compiled__mypyc"] == tmp_path / "gateway" / "_compiled__mypyc.so"


def test_a_stale_build_is_refused_naming_the_changed_source(tmp_path: Path) -> None:
    _write_build(tmp_path, sha="0" * 64)
    with pytest.raises(CompiledBuildError, match=r"stale: gateway/media/jitter\.py changed.*gateway compile --out"):
        read_manifest(tmp_path)


def test_a_build_for_another_python_is_refused(tmp_path: Path) -> None:
    _write_build(tmp_path, tag="cpython-39")
    with pytest.raises(CompiledBuildError, match="built for cpython-39"):
        read_manifest(tmp_path)


def test_a_missing_extension_is_refused(tmp_path: Path) -> None:
    _write_build(tmp_path)
    (tmp_path / "gateway" / "media" / "jitter.so").unlink()
    with pytest.raises(CompiledBuildError, match=r"missing .*jitter\.so"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "no manifest.json there"), ("{", "unreadable"), ('{"format": 1}', "not a gateway build manifest")],
)
def test_a_directory_that_is_not_a_build_is_refused(tmp_path: Path, content: str | None, reason: str) -> None:
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    with pytest.raises(CompiledBuildError, match=reason):
        read_manifest(tmp_path)


def test_the_finder_loads_only_the_built_modules_as_extensions(tmp_path: Path) -> None:
    manifest = read_manifest(_write_build(tmp_path))
    finder = _Finder(manifest.files())
    spec = finder.find_spec("gateway.media.jitter")
    assert spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    assert spec.origin == str(tmp_path / "gateway" / "media" / "jitter.so")
    assert finder.find_spec("gateway.media.call") is None  # not in this build: from source
    assert finder.find_spec("gateway.worker.worker") is None


def test_every_listed_module_has_a_source() -> None:
    assert all(source_path(name).is_file() for name in MODULES)
    assert len(set(MODULES)) == len(MODULES)


def test_no_compiled_module_relies_on_raise_from() -> None:
    # mypyc compiles `raise X from Y` without the `from`: the cause would be lost in the build only.
    import ast

    offenders = []
    for name in MODULES:
        path = source_path(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.cause is not None:
                offenders.append(f"{path.relative_to(PACKAGE_ROOT)}:{node.lineno}")
    assert not offenders, f"use gateway.compiled.caused() instead of `raise ... from` at {offenders}"


def test_caused_sets_the_cause_as_raise_from_does() -> None:
    from gateway.compiled import caused

    try:
        try:
            raise KeyError("k")
        except KeyError as exc:
            raise caused(ValueError("v"), exc)  # noqa: B904
    except ValueError as error:
        assert isinstance(error.__cause__, KeyError) and error.__suppress_context__
    error = caused(ValueError("v"), None)
    assert error.__cause__ is None and error.__suppress_context__  # `from None`


def test_compile_says_what_this_machine_lacks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gateway.compiled.build as build
    from gateway.cli import main

    monkeypatch.setattr(build, "missing_tools", lambda: ["a C compiler (cc)"])
    assert main(["compile", "--out", "/nonexistent/build"]) == 2
    assert "cannot compile here: missing a C compiler (cc)" in capsys.readouterr().err


def test_against_source_without_a_build_is_refused_with_a_reason() -> None:
    from gateway.cli import main

    with pytest.raises(SystemExit, match="--against-source needs --compiled DIR"):
        main(["bench", "calls", "--steps", "50", "--against-source"])


def test_the_per_call_design_on_a_build_is_refused_with_a_reason() -> None:
    from gateway.cli import main

    # Its engine subclasses the compiled TickEngine, which an interpreted class cannot do.
    with pytest.raises(SystemExit, match="--engine percall runs from source only"):
        main(["bench", "calls", "--steps", "50", "--engine", "percall", "--compiled", "/nonexistent/build"])
