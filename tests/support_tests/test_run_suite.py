"""tests/run_suite.py, `make test`'s two tiers: pytest's closing lines read and written back as one, and which
exit statuses fail the run (a tier with no tests does not)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.run_suite import NO_TESTS, TierResult, closing_counts, closing_line, overall_status, tiers


def result(status: int, **counts: int) -> TierResult:
    return TierResult(name="t", status=status, counts=Counter(counts), seconds=1.0)


def test_closing_lines_are_read_with_every_kind_of_count() -> None:
    line = "==== 2 failed, 1180 passed, 3 skipped, 1 xfailed, 4 warnings, 1 error in 343.10s (0:05:43) ===="
    counts, seconds = closing_counts(line)  # type: ignore[misc]
    assert counts == Counter(failed=2, passed=1180, skipped=3, xfailed=1, warnings=4, errors=1)
    assert seconds == 343.1
    assert closing_counts("============ 12 passed in 0.52s ============") == (Counter(passed=12), 0.52)
    assert closing_counts("=== no tests ran in 0.01s ===") == (Counter(), 0.01)
    assert closing_counts("24 passed, 1 deselected in 30.79s") == (Counter(passed=24, deselected=1), 30.79)  # -q
    assert closing_counts("tests/x.py::test_y PASSED") is None
    assert closing_counts("=== short test summary info ===") is None


def test_the_combined_closing_line_reads_as_pytests_own() -> None:
    line = closing_line(Counter(passed=1500, failed=1, skipped=3, xfailed=1), 1502.5)
    assert line.startswith("=") and line.endswith("=") and len(line) == 80
    assert " 1 failed, 1500 passed, 3 skipped, 1 xfailed in 1502.50s (0:25:02) " in line
    assert closing_counts(line) == (Counter(passed=1500, failed=1, skipped=3, xfailed=1), 1502.5)
    assert "no tests ran" in closing_line(Counter(), 0.1)


def test_no_tests_in_a_tier_is_not_a_failure_but_anything_else_is() -> None:
    assert overall_status([result(0, passed=10), result(NO_TESTS)]) == 0
    assert overall_status([result(NO_TESTS), result(NO_TESTS)]) == 0
    assert overall_status([result(1, failed=1), result(0, passed=3)]) == 1
    assert overall_status([result(0, passed=1), result(3)]) == 3


def test_the_first_tier_is_parallel_and_takes_what_is_not_serial() -> None:
    parallel, serial = tiers(2)
    assert parallel.args == ("-m", "not serial", "-n", "2", "--dist", "loadfile")
    assert serial.args == ("-m", "serial")
    assert tiers(0)[0].args == ("-m", "not serial")


def test_a_run_with_nothing_in_one_tier_exits_0_and_ends_with_one_closing_line(tmp_path: Path) -> None:
    # this module alone: all of it is in the parallel tier, the serial tier selects nothing (exit 5)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.run_suite",
            "--workers",
            "0",
            "-p",
            "no:cacheprovider",
            f"{Path(__file__).relative_to(root)}::test_no_tests_in_a_tier_is_not_a_failure_but_anything_else_is",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert closing_counts(last) is not None and "1 passed" in last and "deselected" not in last, last
    assert "tier serial: exit 5" in done.stdout
