"""bench/inband_dtmf.py on a tiny run: both timings are taken over the same calls and the detector costs CPU."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import inband_dtmf


def test_a_small_run_reports_both_timings_and_their_ratio() -> None:
    result = inband_dtmf.measure(calls=3, ticks=20, repeats=2)
    assert result["tick_us_per_call_frame"] > 0
    assert result["tick_with_detector_us_per_call_frame"] > result["tick_us_per_call_frame"]
    assert result["ratio"] > 1.0


def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert inband_dtmf.main(_args("--calls", "2", "--ticks", "10", "--repeats", "1", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["calls"] == 2


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit, match="--calls >= 1"):
        inband_dtmf.main(_args("--calls", "0"))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    inband_dtmf.add_arguments(parser)
    return parser.parse_args(argv)
