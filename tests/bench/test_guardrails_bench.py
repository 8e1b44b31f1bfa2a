"""`gateway bench guardrails`: the talk is checked and trips nothing, and both kinds are measured per frame."""

from __future__ import annotations

from bench.guardrails import BLOCKED, KINDS, PII, run, table, transcript
from gateway.session.guardrail_checks import BlockedTerms, PiiCheck


def test_the_bench_talk_has_numbers_and_trips_no_check() -> None:
    text = transcript(20)
    assert 280 <= len(text) <= 300 and "four five seven two" in text
    blocked = BlockedTerms(phrases=BLOCKED.phrases, patterns=BLOCKED.patterns)
    assert blocked.check(text) is None and PiiCheck(PII.pii).check(text) is None
    assert blocked.check(text + " ask competitor c") is not None, "the list is live: it would trip"


def test_run_starts_its_own_fake_provider_and_reports_both_kinds() -> None:
    summary = run(calls=2, seconds=0.4, warmup_s=0.2, repeats=1)
    assert list(summary["kinds"]) == list(KINDS)
    assert all(figures["us_per_call_frame"] > 0 for figures in summary["kinds"].values())
    assert "built-in" in table(summary)
