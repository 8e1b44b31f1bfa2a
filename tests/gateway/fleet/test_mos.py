"""E-model (ITU-T G.107, simplified) against known points of the R -> MOS curve and the impairments."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.fleet.mos import delay_impairment, effective_equipment_impairment, estimate_mos, mos_from_r, r_factor


@pytest.mark.parametrize(
    ("r", "mos"),
    # G.107 Annex B values, as tabulated in G.109 and most VoIP monitoring literature.
    [(93.2, 4.41), (90, 4.34), (80, 4.02), (70, 3.60), (60, 3.10), (50, 2.58), (0, 1.0), (100, 4.5), (-5, 1.0)],
)
def test_mos_from_r_known_points(r: float, mos: float) -> None:
    assert mos_from_r(r) == pytest.approx(mos, abs=0.01)


def test_perfect_g711_call_scores_the_narrowband_maximum() -> None:
    assert r_factor(loss_pct=0, delay_ms=0) == pytest.approx(93.2)
    assert estimate_mos(loss_pct=0, delay_ms=0) == 4.41


def test_delay_impairment_knee_at_177_ms() -> None:
    assert delay_impairment(100) == pytest.approx(2.4)
    assert delay_impairment(177.3) == pytest.approx(4.2552)
    assert delay_impairment(300) == pytest.approx(0.024 * 300 + 0.11 * (300 - 177.3))


def test_loss_impairment_uses_codec_bpl() -> None:
    # G.711 with PLC (Bpl 25.1): 1 % random loss -> 95 * 1 / 26.1
    assert effective_equipment_impairment(1.0, "PCMU") == pytest.approx(95 / 26.1)
    assert effective_equipment_impairment(1.0, "G711-NOPLC") == pytest.approx(95 / 5.3)
    assert effective_equipment_impairment(0.0, "G729") == pytest.approx(11.0)
    assert estimate_mos(loss_pct=1, delay_ms=0, codec="pcma") == 4.33
    assert estimate_mos(loss_pct=5, delay_ms=150) == pytest.approx(mos_from_r(93.2 - 3.6 - 95 * 5 / 30.1), abs=0.005)


def test_unknown_codec_scores_like_g711() -> None:
    assert estimate_mos(loss_pct=2, delay_ms=80, codec="weird") == estimate_mos(loss_pct=2, delay_ms=80, codec="PCMU")


@given(loss=st.floats(0, 100), delay=st.floats(0, 2000), more_loss=st.floats(0, 50), more_delay=st.floats(0, 1000))
def test_mos_is_bounded_and_never_improves_with_worse_network(
    loss: float, delay: float, more_loss: float, more_delay: float
) -> None:
    mos = estimate_mos(loss_pct=loss, delay_ms=delay)
    assert 1.0 <= mos <= 4.5
    assert estimate_mos(loss_pct=min(100, loss + more_loss), delay_ms=delay + more_delay) <= mos
