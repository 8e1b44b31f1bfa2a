"""Suite-wide fixtures and tiers. Peer helpers live in tests/support.

`make test` runs the suite in two tiers (tests/run_suite.py): the tests marked ``serial`` one at a time, after
every other test has run spread over two processes. This hook is the one place that says what is serial: every
test that uses a real peer (``peer``), everything under tests/e2e, and the modules listed below, whose assertions
depend on having the machine's cores to themselves (real-time media at a 20 ms clock, CPU measured against a
bound) or that load the whole machine themselves.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Apps whose lifespan runs in a test open the database of calls in GATEWAY_STATE_DIR: never the user's own.
os.environ.setdefault("GATEWAY_STATE_DIR", tempfile.mkdtemp(prefix="gateway-test-state-"))

_ROOT = Path(__file__).resolve().parent

#: test modules or directories (relative to tests/) that run in the serial tier although they use no real peer
SERIAL = (
    "e2e/",
    "bench/",  # the benchmarks' process tests
    "gateway/worker/",  # real calls through a worker at its 20 ms clock, the echo correlated
    "gateway/transport/test_clock.py",
    "gateway/transport/test_webrtc.py",
    "gateway/loadtest/test_runner.py",
    "gateway/loadtest/test_multi.py",
    "gateway/loadtest/test_impair.py",
    "gateway/loadtest/test_srtp_load.py",
)


#: the longest modules of the parallel tier, started first so that the other process has the rest meanwhile (with
#: --dist loadfile a module is not split; the mypyc build and the suites run on it take minutes)
FIRST = ("gateway/compiled/test_build.py",)


def _where(item: pytest.Item) -> str:
    try:
        return Path(item.path).resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("peer") is not None or _where(item).startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    items.sort(key=lambda item: not _where(item).startswith(FIRST))  # stable: the rest keep their order
