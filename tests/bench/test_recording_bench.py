"""`gateway bench recording`: recorded runs really write files of the expected size, and the figures are per frame."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.recording import HOUR_TICKS, KINDS, measure, run, table


@pytest.mark.parametrize("kind", KINDS)
async def test_each_kind_measures_and_recorded_kinds_write_their_files(kind: str, tmp_path: Path) -> None:
    result = await measure(kind, calls=3, seconds=0.6, warmup_s=0.2, rate=16_000, directory=tmp_path)
    assert result.ticks == 30 and result.calls == 3
    assert 0 < result.us_per_call_frame < 50_000
    files = sorted((tmp_path / kind).rglob(f"*.{kind}")) if kind != "off" else []
    assert len(files) == (0 if kind == "off" else 3)
    if kind == "wav":  # 16 kHz stereo PCM16: 64,000 bytes a second of the measured ticks
        assert result.bytes_per_call / result.ticks * HOUR_TICKS == pytest.approx(230.4e6, rel=0.01)
    elif kind == "ogg":
        assert 0 < result.bytes_per_call / result.ticks * HOUR_TICKS < 40e6


def test_run_reports_every_kind_against_the_unrecorded_one() -> None:
    summary = run(calls=2, seconds=0.4, warmup_s=0.1, repeats=1, rate=16_000)
    assert list(summary["kinds"]) == list(KINDS)
    assert summary["kinds"]["off"]["ratio_to_off"] == 1.0
    assert summary["kinds"]["wav"]["gb_per_1000_hours"] == pytest.approx(230.4, rel=0.01)
    assert "ogg" in table(summary)
