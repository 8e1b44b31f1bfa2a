"""``gateway bench records``: what the record an RTP parse returns costs in the compiled build, three ways.

The receive path parses every caller's packet into a record (:class:`gateway.media.rtp.RtpPacket`). In the
compiled build (ADR 0008) the obvious immutable records are not native: mypyc builds a ``NamedTuple`` through
the ``__new__`` that ``collections.namedtuple`` generates, and a frozen dataclass through the ``__init__`` that
``dataclasses`` writes (which sets every field with ``object.__setattr__``), both interpreted. A plain class
with ``__slots__`` and its own ``__init__`` is compiled into a native class and built without the interpreter.

This compiles :mod:`bench._records_probe` with mypyc (as ``gateway compile`` does, opt level 3) into a
temporary directory and times the parse returning each kind of record, interleaved and repeated, against the
parse alone (``struct.unpack_from`` and the payload slice). It also says, for each record class, whether
building one runs interpreted code: the structural fact behind the times, which does not depend on the
machine. CPU time of the process; a shared machine's other load inflates every case alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.media.rtp import build_rtp

PROBE = Path(__file__).with_name("_records_probe.py")
MODULE = "gateway_records_probe"  # the compiled probe's own top-level name, apart from the gateway package

#: (label, the probe's loop, the probe's record class or None for the parse alone)
CASES: tuple[tuple[str, str, str | None], ...] = (
    ("parse alone (no record)", "loop_unpack_only", None),
    ("NamedTuple", "loop_tuple", "TupleRecord"),
    ("frozen dataclass", "loop_frozen", "FrozenRecord"),
    ("class with __slots__ (parse_rtp's RtpPacket)", "loop_slots", "SlotsRecord"),
)


class ProbeBuildError(RuntimeError):
    """The probe could not be compiled here; the message says what is missing or what failed."""


@dataclass(frozen=True, slots=True)
class RecordCase:
    label: str
    record: str | None
    interpreted_constructor: bool | None  # building one runs interpreted code (None: no record)
    ns_per_packet: float  # median over the repeats, CPU time
    runs: list[float]
    record_ns: float | None  # ns_per_packet less the parse alone's


# Run in a child process: mypy changes the process it runs in (gc thresholds, os.environ), which must not
# reach the caller (a test process, say).
_BUILD = """
import sys
from mypyc.build import mypycify
from setuptools import Distribution

source, work = sys.argv[1], sys.argv[2]
extensions = mypycify(["--config-file", "mypy.ini", source], opt_level="3", target_dir=work + "/c")
dist = Distribution({"name": "probe", "ext_modules": extensions})
dist.script_args = ["build_ext", "--build-lib", work + "/lib", "--build-temp", work + "/obj"]
dist.parse_command_line()
dist.run_commands()
"""


def compile_probe(work: Path) -> Path:
    """Compile the probe with mypyc into ``work`` (in a child process); the path of the extension module."""
    from gateway.compiled.build import missing_tools

    missing = missing_tools()
    if missing:
        raise ProbeBuildError("cannot compile the probe here: missing " + ", ".join(missing))
    source = work / f"{MODULE}.py"
    source.write_text(PROBE.read_text())
    (work / "mypy.ini").write_text(f"[mypy]\ncache_dir = {work / 'mypy-cache'}\nignore_missing_imports = True\n")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _BUILD, source.name, str(work)],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise ProbeBuildError("mypyc build of the probe took over 300 s") from None
    if done.returncode != 0:
        raise ProbeBuildError(f"mypyc build of the probe failed:\n{(done.stdout + done.stderr)[-3000:]}")
    built = sorted((work / "lib").glob(f"{MODULE}*.so")) + sorted((work / "lib").glob(f"{MODULE}*.pyd"))
    if not built:
        raise ProbeBuildError(f"mypyc made no extension for the probe in {work / 'lib'}")
    return built[0]


def load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ProbeBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # mypyc's module init looks itself up by name
    spec.loader.exec_module(module)
    return module


def interpreted_constructor(cls: type) -> bool:
    """Whether building a ``cls`` runs Python code: its ``__new__`` or ``__init__`` is a Python function (a
    generated one, for a NamedTuple or a dataclass) rather than a slot of a compiled type."""
    for klass in cls.__mro__:
        if klass is object or klass is tuple:
            continue
        for name in ("__new__", "__init__"):
            method = vars(klass).get(name)
            if isinstance(getattr(method, "__func__", method), types.FunctionType):  # __new__ is a staticmethod
                return True
    return False


def measure(probe: types.ModuleType, *, repeats: int = 5, count: int = 200_000) -> list[RecordCase]:
    datagram = build_rtp(payload_type=0, sequence_number=1234, timestamp=160, ssrc=0x1234ABCD, payload=b"\xff" * 160)
    loops = [getattr(probe, loop) for _, loop, _ in CASES]
    for loop in loops:  # warm up
        loop(datagram, count // 10)
    times: list[list[float]] = [[] for _ in CASES]
    for _ in range(repeats):
        for k, loop in enumerate(loops):
            started = time.process_time()
            loop(datagram, count)
            times[k].append((time.process_time() - started) / count * 1e9)
    base = statistics.median(times[0])
    cases = []
    for (label, _, record), runs in zip(CASES, times, strict=True):
        median = statistics.median(runs)
        cases.append(
            RecordCase(
                label=label,
                record=record,
                interpreted_constructor=interpreted_constructor(getattr(probe, record)) if record else None,
                ns_per_packet=round(median, 1),
                runs=[round(t, 1) for t in runs],
                record_ns=round(median - base, 1) if record else None,
            )
        )
    return cases


def run(*, repeats: int, count: int, json_output: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="gateway-records-") as tmp:
        try:
            probe = load(compile_probe(Path(tmp)))
        except ProbeBuildError as exc:
            print(f"gateway bench records: {exc}", file=sys.stderr)
            return 2
        try:
            compiled = not isinstance(probe.loop_slots, types.FunctionType)
            cases = measure(probe, repeats=repeats, count=count)
        finally:
            sys.modules.pop(MODULE, None)  # its file goes with the directory
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "compiled": compiled,
        "repeats": repeats,
        "count": count,
        "load_average": list(os.getloadavg()),
    }
    if json_output:
        print(json.dumps({"results": [asdict(case) for case in cases], "env": env}, indent=2))
        return 0
    slots = cases[-1]
    print(
        f"gateway bench records: an RTP parse compiled with mypyc, by the record it returns; {count} packets per "
        f"timing, median of {repeats}, CPU time (compiled: {compiled}, load average {env['load_average'][0]:.2f})"
    )
    print(f"{'record':46s} {'ns/packet':>10s} {'record ns':>10s} {'vs slots':>9s}  interpreted constructor")
    for case in cases:
        record = f"{case.record_ns:10.1f}" if case.record_ns is not None else f"{'-':>10s}"
        ratio = f"{case.ns_per_packet / slots.ns_per_packet:8.2f}x" if case.record else f"{'-':>9s}"
        interpreted = "-" if case.interpreted_constructor is None else ("yes" if case.interpreted_constructor else "no")
        print(f"{case.label:46s} {case.ns_per_packet:10.1f} {record} {ratio}  {interpreted}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    parser.add_argument("--count", type=int, default=200_000, help="packets per timing")


def main(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.count < 1000:
        raise SystemExit("gateway bench records: --repeats >= 1 and --count >= 1000")
    return run(repeats=args.repeats, count=args.count, json_output=args.json)
