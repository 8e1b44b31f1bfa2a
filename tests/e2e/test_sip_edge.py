"""The SIP edge shuts out password guessing and scanners, on a live ``gateway run`` in a private network
namespace (tests/e2e/edge_scenario.py runs the attack and reports; each test judges one promise):
a guessing source is silenced after a few wrong passwords while a real caller from another address gets
in and is heard; sipvicious finds nothing and cracks nothing; blocks are counted, on the event stream and
in log lines fail2ban itself reads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.edge_scenario import ATTACKER, CALLER, MAX_FAILURES, RESULT_PREFIX, SCANNER, run
from tests.support.machine import MachineLoad, MachineWatch, assert_quality
from tests.support.netns import python_call_argv, require_netns, run_scenario_in_netns
from tests.support.peers import require_binary, require_module
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(200)]

SCENARIO_LIMIT_S = 150.0


async def _run_scenario(workdir: Path) -> dict[str, Any]:
    async with ProcessGroup(workdir / "outer-logs") as procs:
        argv = python_call_argv(run, str(workdir))
        return await run_scenario_in_netns(procs, "edge-scenario", argv, within=SCENARIO_LIMIT_S, prefix=RESULT_PREFIX)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], MachineLoad | None]:
    require_netns()
    for binary, package in (("svmap", "sipvicious"), ("svcrack", "sipvicious"), ("fail2ban-regex", "fail2ban")):
        require_binary(binary, package=package)
    require_module("pjsua2", package="pjsua2-python")
    watch = MachineWatch.start()
    result = asyncio.run(_run_scenario(tmp_path_factory.mktemp("sip-edge")))
    load = watch.stop()
    assert result["stage"] == "done", result
    return result, load


@pytest.fixture
def report(scenario: tuple[dict[str, Any], MachineLoad | None]) -> dict[str, Any]:
    return scenario[0]


def test_guessing_source_is_silenced_after_a_few_wrong_passwords(report: dict[str, Any]) -> None:
    guessing = report["guessing"]
    # Each wrong answer before the limit gets a fresh 401; the one reaching it, and all after, get nothing.
    assert guessing["wrong_answers"] == [401] * (MAX_FAILURES - 1) + [None], guessing
    assert guessing["blast_replies"] == 0, guessing
    assert guessing["blast_rate_per_s"] >= 100, guessing


def test_a_real_caller_from_another_address_gets_in_and_is_heard(
    scenario: tuple[dict[str, Any], MachineLoad | None],
) -> None:
    report, load = scenario
    assert "CONFIRMED" in report["call_states"], report["call_states"]
    # Recognizably the caller's own speech on any machine; as clean as an unloaded call on a quiet one.
    assert report["call"]["correlation"] >= 0.5, report["call"]
    assert_quality(report["call"]["correlation"] >= 0.9, f"echo {report['call']}", load)


def test_sipvicious_finds_nothing_and_cracks_nothing(report: dict[str, Any]) -> None:
    assert not report["svmap"]["found_device"], report["svmap"]["output"]
    assert not report["svcrack_dropped"]["found"], report["svcrack_dropped"]["output"]
    assert report["metrics_first"].get("scanner_dropped", 0) > 0, report["metrics_first"]
    # With the scanner drop off the right word comes after the first few guesses: the lockout stops svcrack.
    assert not report["svcrack_locked"]["found"], report["svcrack_locked"]["output"]


def test_blocks_are_counted_reported_and_readable_by_fail2ban(report: dict[str, Any]) -> None:
    metrics = report["metrics"]
    assert metrics.get("blocks", 0) >= 1 and metrics.get("auth_failed", 0) >= MAX_FAILURES, metrics
    assert metrics.get("blocked_dropped", 0) >= 1, metrics
    blocked = report["blocked_events"]
    assert [(e["scope"], e["key"]) for e in blocked] == [("source", SCANNER)], blocked
    assert blocked[0]["failures"] == MAX_FAILURES
    fail2ban = report["fail2ban"]
    assert fail2ban["returncode"] == 0 and fail2ban["matched"] >= 2 * MAX_FAILURES, fail2ban
    assert ATTACKER in fail2ban["hosts"] and SCANNER in fail2ban["hosts"], fail2ban
    assert CALLER not in fail2ban["hosts"], fail2ban
