"""Suite-wide fixtures and tiers. Peer helpers live in tests/support.

`make test` runs the suite in two tiers (tests/run_suite.py): the tests marked ``serial`` one at a time, after
every other test has run spread over two processes. This hook is the one place that says what is serial: every
test that uses a real peer (``peer``), everything under tests/e2e, and the modules listed below, whose assertions
depend on having the machine's cores to themselves (real-time media at a 20 ms clock, CPU measured against a
bound) or that load the whole machine themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent

#: test modules or directories (relative to tests/) that run in the serial tier although they use no real peer
SERIAL = (
    "e2e/",
    "gateway/bench/",
    "bench/test_websocket_bot_bench.py",
    "gateway/loadtest/test_runner.py",
    "gateway/loadtest/test_multi.py",
    "gateway/loadtest/test_impair.py",
    "gateway/loadtest/test_srtp_load.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            where = Path(item.path).resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            continue
        if item.get_closest_marker("peer") is not None or where.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
