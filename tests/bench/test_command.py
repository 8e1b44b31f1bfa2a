"""``gateway bench``'s table: every benchmark named there has its arguments and ``main``, and none is imported
until it is named on the command line (``gateway run`` builds the same parser)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.command import BENCHES
from gateway.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_benchmark_takes_its_own_arguments(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gateway bench {name} [-h]")
    assert BENCHES[name][1].split()[0] in " ".join(out.split())  # the table's help is the description


def test_the_parser_is_built_without_importing_a_benchmark() -> None:
    code = (
        "import sys; from gateway.cli import build_parser; build_parser(); "
        "print(sorted(name for name in sys.modules if name == 'bench' or name.startswith('bench.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['bench',", "'bench.command']"]


def test_the_named_benchmark_alone_is_imported_and_run() -> None:
    args = build_parser().parse_args(["bench", "frames", "--count", "5"])
    assert args._bench_module.__name__ == "bench.frames" and args.count == 5


def test_an_unknown_benchmark_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "no-such-bench"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-bench'" in capsys.readouterr().err
