"""bench/warm_bridge.py on a tiny run: both kinds are timed over the same legs, and the bridge hands every heard
frame on (the bench checks it), so a bridge that dropped audio could not report a cheap figure."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import warm_bridge


def test_a_small_run_times_both_kinds_and_reports_their_ratio() -> None:
    result = warm_bridge.run(legs=4, seconds=0.2, warmup_s=0.04, repeats=1)
    assert result["agent_us_per_leg_frame"] > 0 and result["bridged_us_per_leg_frame"] > 0
    assert result["bridged_over_agent"] == pytest.approx(
        result["bridged_us_per_leg_frame"] / result["agent_us_per_leg_frame"], rel=0.05, abs=0.01
    )
    assert result["bridged_call_over_agent_call"] == pytest.approx(2 * result["bridged_over_agent"], abs=0.011)


def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert warm_bridge.main(_args("--legs", "2", "--seconds", "0.1", "--warmup", "0", "--repeats", "1", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["legs"] == 2


@pytest.mark.parametrize("argv", [("--legs", "3"), ("--legs", "0"), ("--repeats", "0"), ("--seconds", "0")])
def test_bad_arguments_are_refused(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit, match="--legs even and >= 2"):
        warm_bridge.main(_args(*argv))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    warm_bridge.add_arguments(parser)
    return parser.parse_args(argv)
