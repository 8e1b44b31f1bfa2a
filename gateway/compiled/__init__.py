"""Compiled builds of the media plane's hot modules (mypyc), used when ``GATEWAY_COMPILED`` names one.

``gateway compile --out DIR`` (:mod:`gateway.compiled.build`) compiles :data:`MODULES` with mypyc into
``DIR``: one extension per module, one shared library for the group, and ``manifest.json`` naming each
extension and the SHA-256 of the source it was compiled from. With ``GATEWAY_COMPILED=DIR`` in the environment,
``import gateway`` puts a finder in front of the import system that loads those modules from ``DIR`` and
everything else from source. The compiled modules behave as their sources do (the same code, type-checked and
compiled), they only cost less CPU per call (docs/performance.md, ADR 0008).

A build whose sources no longer match the package refuses to load: :class:`CompiledBuildError` names the
modules that changed and the command that rebuilds them. Running stale code silently is the failure this
guards against; without ``GATEWAY_COMPILED`` the package is plain Python and nothing here runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

ENV = "GATEWAY_COMPILED"
MANIFEST = "manifest.json"
GROUP = "gateway._compiled"  # mypyc's shared library for the group is the module GROUP + "__mypyc"
FORMAT = 1

# Per-packet and per-frame code: the RTP receive path, the jitter buffer, the tick, the session's per-frame
# push/pull and playout, the provider write, the clock. Modules that mypyc cannot compile (async generators,
# subclasses of built-in exceptions other than Exception) stay out; what they cost is in the profile.
MODULES: tuple[str, ...] = (
    "gateway.media.ahead",
    "gateway.media.call",
    "gateway.media.jitter",
    "gateway.media.reception",
    "gateway.media.rfc4733",
    "gateway.media.rtcp",
    "gateway.media.rtp",
    "gateway.media.tick",
    "gateway.providers._frames",
    "gateway.providers._link",
    "gateway.providers.openai",
    "gateway.session.g711",
    "gateway.session.pipe",
    "gateway.session.playout",
    "gateway.session.rotation",
    "gateway.session.session",
    "gateway.session.stats",
    "gateway.session.tasks",
    "gateway.session.toolrunner",
    "gateway.session.turns",
    "gateway.transport.clock",
    "gateway.transport.rtp_socket",
    "gateway.worker.bridge",
    "gateway.worker.routes",
    "gateway.worker.sip_calls",
    "gateway.worker.worker",
)

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds gateway/


_E = TypeVar("_E", bound=BaseException)


def caused(error: _E, cause: BaseException | None) -> _E:
    """``raise caused(Error(...), exc)`` where ``raise Error(...) from exc`` is meant, in the modules of
    :data:`MODULES`: mypyc compiles ``raise ... from`` without its ``from`` (no ``__cause__``, and ``from None``
    does not hide the context). ``cause=None`` is ``from None``."""
    error.__cause__ = cause  # also sets __suppress_context__, as ``from`` does
    return error


class CompiledBuildError(ImportError):
    """``GATEWAY_COMPILED`` names a build that cannot be used: missing, for another Python, or stale."""


@dataclass(frozen=True, slots=True)
class CompiledModule:
    name: str
    path: Path  # the extension module
    source: str  # the source file it was compiled from, relative to PACKAGE_ROOT
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    directory: Path
    cache_tag: str
    modules: tuple[CompiledModule, ...]
    support: dict[str, Path]  # module name -> extension (the group's shared library)

    def files(self) -> dict[str, Path]:
        files = {module.name: module.path for module in self.modules}
        files.update(self.support)
        return files


def source_path(name: str, root: Path = PACKAGE_ROOT) -> Path:
    return root.joinpath(*name.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(directory: Path) -> Manifest:
    """The manifest in ``directory``, checked against this interpreter and the package's sources."""
    path = directory / MANIFEST
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompiledBuildError(f"{ENV}={directory}: no {MANIFEST} there; build one with `gateway compile`") from None
    except (OSError, ValueError) as exc:
        raise CompiledBuildError(f"{ENV}={directory}: {MANIFEST} is unreadable ({exc})") from None
    try:
        if document["format"] != FORMAT:
            raise CompiledBuildError(f"{path}: format {document['format']!r}, this gateway reads {FORMAT}")
        manifest = Manifest(
            directory=directory,
            cache_tag=str(document["cache_tag"]),
            modules=tuple(
                CompiledModule(
                    name=str(entry["name"]),
                    path=directory / str(entry["file"]),
                    source=str(entry["source"]),
                    sha256=str(entry["sha256"]),
                )
                for entry in document["modules"]
            ),
            support={str(name): directory / str(file) for name, file in document["support"].items()},
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise CompiledBuildError(f"{path}: not a gateway build manifest ({exc!r})") from None
    check(manifest)
    return manifest


def check(manifest: Manifest, root: Path = PACKAGE_ROOT) -> None:
    """Raise :class:`CompiledBuildError` unless every extension is there, for this Python, from these sources."""
    tag = sys.implementation.cache_tag
    if manifest.cache_tag != tag:
        raise CompiledBuildError(
            f"{ENV}={manifest.directory} was built for {manifest.cache_tag}, this is {tag}; rebuild it"
        )
    missing = [str(path) for path in manifest.files().values() if not path.is_file()]
    if missing:
        raise CompiledBuildError(f"{ENV}={manifest.directory}: missing {', '.join(missing)}; rebuild it")
    changed = []
    for module in manifest.modules:
        source = root / module.source
        if not source.is_file() or digest(source) != module.sha256:
            changed.append(module.source)
    if changed:
        raise CompiledBuildError(
            f"{ENV}={manifest.directory} is stale: {', '.join(changed)} changed since it was compiled; "
            f"rebuild it with `gateway compile --out {manifest.directory}` (or unset {ENV})"
        )


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


_enabled: Manifest | None = None


def enable(directory: str | Path) -> Manifest:
    """Load :data:`MODULES` from the build in ``directory`` from now on. Call before they are imported."""
    global _enabled
    manifest = read_manifest(Path(directory).resolve())
    if _enabled is not None:
        if _enabled.directory != manifest.directory:
            raise CompiledBuildError(f"{ENV}: {_enabled.directory} is already in use, not {manifest.directory}")
        return _enabled
    already = [module.name for module in manifest.modules if module.name in sys.modules]
    if already:
        raise CompiledBuildError(f"{ENV}: {', '.join(already)} were imported from source before the build")
    sys.meta_path.insert(0, _Finder(manifest.files()))
    _enabled = manifest
    return manifest


def status() -> str:
    """One line for logs: which media plane this process runs."""
    if _enabled is None:
        return "media plane: Python source"
    # By where it came from. A module that compiled code imports is set up by the group's library itself, with an
    # origin of its own making (under the build, not the exact file), so the test is "an extension of the build".
    root = str(_enabled.directory) + "/"
    loaded: list[str] = []
    from_source: list[str] = []
    for m in _enabled.modules:
        if m.name not in sys.modules:
            continue  # not imported (yet) by this process
        (loaded if _from_build(m.name, root) else from_source).append(m.name)
    line = f"media plane: compiled ({len(loaded)} of {len(_enabled.modules)} modules loaded from {_enabled.directory}"
    return line + (f"; from source: {', '.join(from_source)})" if from_source else ")")


def _from_build(name: str, root: str) -> bool:
    """Whether the imported module ``name`` is an extension module from under ``root``."""
    spec = getattr(sys.modules.get(name), "__spec__", None)
    loader, origin = getattr(spec, "loader", None), getattr(spec, "origin", None) or ""
    return isinstance(loader, importlib.machinery.ExtensionFileLoader) and origin.startswith(root)
