"""bench/pipeline.py run small: real CallSessions on the pipeline with the loopback fakes."""

from __future__ import annotations

import argparse

import pytest

from bench import pipeline

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    pipeline.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_the_latency_run_measures_each_turn() -> None:
    result = await pipeline.latency(_args("latency", "--turns", "2"))
    added = result["added_ms"]
    assert added["n"] >= 1
    # Only sanity: the figures themselves are the lab entry's, on a machine not running the suite.
    assert 0 <= added["p50"] < 1000 and result["endpoint_ms"] == pipeline.ENDPOINT_MS


async def test_the_barge_in_run_finds_the_playout_stopped_in_the_same_tick() -> None:
    result = await pipeline.barge_in(_args("barge-in", "--turns", "3"))
    assert result["barge_ins"] >= 1
    assert result["agent_frames_after_barge_in"] == [0] * result["barge_ins"]
