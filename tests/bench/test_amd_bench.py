"""The labelled AMD set (bench/amd_set.py, espeak-ng speech) classified by the detector with its defaults:
the baseline's measured precision and recall hold (docs/performance/2026-12-07-amd.md has the full run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.amd import classify, main, scores
from bench.amd_set import build
from tests.support.peers import require_binary

pytestmark = pytest.mark.peer


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list:
    require_binary("espeak-ng", package="espeak-ng")
    return build(tmp_path_factory.mktemp("amd-set"), per_label=12)


def test_the_set_has_every_label_and_its_beeps(cases: list) -> None:
    labels = [c.label for c in cases]
    assert labels.count("human") == 12 and labels.count("machine") == 12 and labels.count("fax") == 3
    assert sum(1 for c in cases if c.beep_at_s is not None) == 11  # one machine in eight has no beep


def test_baseline_precision_and_recall(cases: list) -> None:
    outcomes = [classify(case) for case in cases]
    table = scores(outcomes)
    assert table["fax"]["recall"] == 1.0 and table["fax"]["precision"] == 1.0, table
    assert table["human"]["recall"] >= 0.8 and table["machine"]["recall"] >= 0.75, table
    # Every beep found starts within two frames of where it was placed.
    errors = [o.beep_error_s for o in outcomes if o.beep_error_s is not None]
    assert errors and max(abs(e) for e in errors) <= 0.04, errors


def test_the_bench_prints_its_report(cases: list, capsys: pytest.CaptureFixture[str]) -> None:
    directory = Path(cases[0].path).parent
    assert main(argparse.Namespace(per_label=12, repeats=1, dir=directory, json=True)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"] == 27 and report["cpu"]["amd_us"] > 0
    assert set(report["scores"]) == {"human", "machine", "fax"}


def test_the_oracle_words_raise_precision_and_recall(cases: list, capsys: pytest.CaptureFixture[str]) -> None:
    """--words oracle (the spoken text, an upper bound): no label loses, the 'Hi!' machines are caught."""
    directory = Path(cases[0].path).parent
    args = argparse.Namespace(per_label=12, repeats=1, dir=directory, json=True, words="oracle")
    assert main(argparse.Namespace(**vars(args), endpoint_ms=300, latency_ms=200)) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    timing, words = lines[0]["scores"], lines[1]["scores"]
    assert lines[1]["mode"] == "timing+oracle"
    for label in ("human", "machine"):
        assert words[label]["recall"] >= timing[label]["recall"], (label, timing, words)
        assert words[label]["precision"] >= timing[label]["precision"], (label, timing, words)
    assert words["machine"]["recall"] == 1.0, lines[1]


def test_every_case_knows_what_it_says(cases: list) -> None:
    for case in cases:
        assert bool(case.spoken) == (case.label != "fax"), case
        assert all(0 <= p.start_s < p.end_s for p in case.spoken)
