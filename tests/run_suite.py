"""The whole suite in two tiers, as `make test` runs it: `python -m tests.run_suite [pytest args]`.

1. **parallel**: every test not marked ``serial``, spread over ``-n`` processes by pytest-xdist (a module stays
   in one process, ``--dist loadfile``, so its module-scoped fixtures are built once). These tests are sans-I/O,
   unit, or local I/O that does not depend on having the machine to itself.
2. **serial**: the tests marked ``serial`` (tests/conftest.py marks every ``peer`` test, everything under
   tests/e2e and the timing-sensitive modules it lists), one at a time, after the first tier, so that real
   peers and load tests do not share the cores with the rest of the suite.

Both tiers run even when the first fails, so one run shows every failure. A tier that selects nothing (pytest's
exit status 5, e.g. with ``-k`` or a path that only one tier holds) is not a failure. The last line is pytest's
own closing line for the two tiers together, so it reads as one pytest run: ``=== 1234 passed in 1500.00s ===``.

Options of this runner (the rest goes to pytest, to both tiers): ``--workers N`` (default: ``GATEWAY_TEST_WORKERS``
or 2; 0 runs the first tier in one process too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

NO_TESTS = 5
#: the words of pytest's closing line, in the order it prints them
_KINDS = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "errors")
_CLOSING = re.compile(r"^(?:=+ )?(?P<body>.*?) in (?P<seconds>[0-9.]+)s(?: \([0-9:]+\))?(?: =+)?$")  # -q: no rules
_COUNT = re.compile(r"(\d+) (failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?)\b")


@dataclass(frozen=True, kw_only=True)
class Tier:
    name: str
    args: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TierResult:
    name: str
    status: int
    counts: Counter[str]
    seconds: float


def tiers(workers: int) -> list[Tier]:
    parallel = ("-n", str(workers), "--dist", "loadfile") if workers > 0 else ()
    return [
        Tier(name="parallel", args=("-m", "not serial", *parallel)),
        Tier(name="serial", args=("-m", "serial")),
    ]


def closing_counts(line: str) -> tuple[Counter[str], float] | None:
    """The counts and seconds of a pytest closing line (``== 3 passed, 1 skipped in 2.50s ==``), else None."""
    match = _CLOSING.match(line.strip())
    if match is None:
        return None
    counts: Counter[str] = Counter()
    for number, kind in _COUNT.findall(match["body"]):
        counts[{"warning": "warnings", "error": "errors"}.get(kind, kind)] += int(number)
    if not counts and "no tests ran" not in match["body"]:
        return None
    return counts, float(match["seconds"])


def closing_line(counts: Counter[str], seconds: float) -> str:
    """pytest's closing line for these counts (its wording, its width of 80 columns)."""
    body = ", ".join(f"{counts[kind]} {kind}" for kind in _KINDS if counts[kind]) or "no tests ran"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    text = f" {body} in {seconds:.2f}s ({hours}:{minutes:02d}:{secs:02d}) "
    pad = max(0, 80 - len(text))
    return "=" * (pad // 2) + text + "=" * (pad - pad // 2)


def run_tier(tier: Tier, extra: Sequence[str]) -> TierResult:
    argv = [sys.executable, "-m", "pytest", *tier.args, *extra]
    print(f"\n##### tier {tier.name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    last: tuple[Counter[str], float] | None = None
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            found = closing_counts(line)
            if found is not None:
                last = found
        status = proc.wait()
    counts, seconds = last if last is not None else (Counter(), time.monotonic() - started)
    return TierResult(name=tier.name, status=status, counts=counts, seconds=seconds)


def overall_status(results: Sequence[TierResult]) -> int:
    """The first tier's status that is a failure (anything but 0 and "no tests"), else 0."""
    for result in results:
        if result.status not in (0, NO_TESTS):
            return result.status
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    workers = int(os.environ.get("GATEWAY_TEST_WORKERS", "2"))
    if "--workers" in args:
        at = args.index("--workers")
        workers = int(args[at + 1])
        del args[at : at + 2]
    results = []
    started = time.monotonic()
    for tier in tiers(workers):
        results.append(run_tier(tier, args))
        if results[-1].status == 2 and results[-1].counts.total() == 0:
            break  # interrupted or a usage error: the next tier would say the same
    total: Counter[str] = Counter()
    for result in results:
        total.update(result.counts)
    del total["deselected"]  # each tier deselects what the other runs: not a count of the whole run
    print()
    for result in results:
        print(f"tier {result.name}: exit {result.status}, {closing_line(result.counts, result.seconds).strip('= ')}")
    print(closing_line(total, time.monotonic() - started))
    return overall_status(results)


if __name__ == "__main__":
    sys.exit(main())
