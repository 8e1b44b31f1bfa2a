"""``gateway bench fec``: real libopus speech through the caller's jitter buffer at a shallow and a deep phase."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.fec import measure
from gateway.cli import main


def test_a_frame_grown_after_a_shallow_loss_lets_fec_mend_the_losses_after_it() -> None:
    runs, _ = measure(seeds=1, loss_pct=5.0, seconds=20.0)
    by = {(r.phase, r.grows): r for r in runs}
    kept, grown, deep = by["shallow", False], by["shallow", True], by["deep", False]
    assert kept.lost == grown.lost == deep.lost >= 30
    # At the shallowest phase the next packet is never buffered in time: FEC mends only the losses of the first
    # 30 packets, before the phase moved.
    assert kept.mended <= deep.mended // 4 and kept.inserted == 0
    # One frame grown in the first pause after a loss, and from then on FEC mends about as much as a buffer with
    # a frame of margin: the lost frames sound about 6 dB better.
    assert grown.inserted == 1 and grown.mended >= 0.8 * deep.mended
    assert grown.lost_snr_db >= kept.lost_snr_db + 4.0 and grown.speech_snr_db > kept.speech_snr_db
    # With the margin there already, nothing is inserted and nothing changes.
    assert by["deep", True] == dataclasses.replace(deep, grows=True)


def test_the_command_prints_every_run_as_json_and_refuses_a_bad_loss(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "fec", "--json", "--seeds", "1", "--seconds", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {(r["phase"], r["grows"]) for r in report["runs"]} == {
        ("shallow", False),
        ("shallow", True),
        ("deep", False),
        ("deep", True),
    }
    with pytest.raises(SystemExit, match="loss-pct"):
        main(["bench", "fec", "--loss-pct", "60"])
