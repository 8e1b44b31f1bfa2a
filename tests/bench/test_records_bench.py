"""``gateway bench records``: the record an RTP parse returns, compiled with mypyc three ways.

The probe is compiled for real (a few seconds; needs a C compiler: skips locally without one, fails under
CI=true). What is asserted is structural, not a time: which records are built through interpreted code.
"""

from __future__ import annotations

import gc
import json
import os
import types
from typing import NamedTuple

import pytest

from bench.records import interpreted_constructor
from gateway.cli import main
from tests.support.peers import require_compiler


@pytest.fixture
def compiler() -> None:
    require_compiler()


def test_the_command_compiles_the_probe_and_says_which_records_run_interpreted_code(
    compiler: None, capsys: pytest.CaptureFixture[str]
) -> None:
    thresholds, environment = gc.get_threshold(), dict(os.environ)
    assert main(["bench", "records", "--json", "--repeats", "1", "--count", "2000"]) == 0
    report = json.loads(capsys.readouterr().out)
    # mypy sets the collector's thresholds and os.environ of the process it runs in: it runs in a child.
    assert gc.get_threshold() == thresholds and dict(os.environ) == environment
    assert report["env"]["compiled"] is True
    by = {case["record"]: case for case in report["results"]}
    assert by[None]["interpreted_constructor"] is None and by[None]["record_ns"] is None
    # Compiled, the NamedTuple and the frozen dataclass are still built through generated Python; the plain
    # class with __slots__ is native.
    assert by["TupleRecord"]["interpreted_constructor"] is True
    assert by["FrozenRecord"]["interpreted_constructor"] is True
    assert by["SlotsRecord"]["interpreted_constructor"] is False
    assert all(case["ns_per_packet"] > 0 and len(case["runs"]) == 1 for case in report["results"])


def test_interpreted_constructor_tells_python_classes_from_native_ones() -> None:
    class Point(NamedTuple):
        x: int

    class Plain:
        def __init__(self, x: int) -> None:
            self.x = x

    assert interpreted_constructor(Point) and interpreted_constructor(Plain)
    assert not interpreted_constructor(int) and not interpreted_constructor(types.SimpleNamespace)


def test_bad_options_are_refused() -> None:
    with pytest.raises(SystemExit, match="--count >= 1000"):
        main(["bench", "records", "--count", "10"])
