"""Call quality estimate: the E-model of ITU-T G.107, simplified, as workers and the dashboard report it.

    R = 93.2 - Id(delay) - Ie_eff(loss, codec)

* 93.2 is R0 - Is with every G.107 default (Table 3) — the best a narrowband call gets.
* Id, delay impairment, uses the usual closed-form fit of G.107's Idd/Idte for a one-way
  mouth-to-ear delay ``d`` in ms: ``Id = 0.024 d + 0.11 (d - 177.3) H(d - 177.3)``.
* Ie_eff, equipment impairment under packet loss (G.107 §7.6, with BurstR = 1 for random loss):
  ``Ie_eff = Ie + (95 - Ie) * Ppl / (Ppl / BurstR + Bpl)``, with Ie and Bpl per codec from
  ITU-T G.113 Appendix I (G.711 with packet-loss concealment: Ie 0, Bpl 25.1).
* MOS from R (G.107 Annex B): 1 below R=0, 4.5 above R=100, else ``1 + 0.035 R + R (R-60)(100-R) 7e-6``.

G.722 and Opus are wideband, and G.107's scale is narrowband (their own is G.107.1's, up to R 129): both are
scored as G.711 with concealment, which understates them (Opus also has FEC); the figure stays comparable
between calls, whatever their codec, which is what an operator needs.
"""

from __future__ import annotations

from dataclasses import dataclass

R_DEFAULT = 93.2


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecImpairment:
    """G.113 Appendix I parameters: equipment impairment Ie and packet-loss robustness Bpl."""

    ie: float
    bpl: float


CODEC_IMPAIRMENTS: dict[str, CodecImpairment] = {
    "PCMU": CodecImpairment(ie=0.0, bpl=25.1),
    "PCMA": CodecImpairment(ie=0.0, bpl=25.1),
    "G711": CodecImpairment(ie=0.0, bpl=25.1),
    "G711-NOPLC": CodecImpairment(ie=0.0, bpl=4.3),
    "G729": CodecImpairment(ie=11.0, bpl=19.0),
    "G722": CodecImpairment(ie=0.0, bpl=25.1),  # wideband, on the narrowband scale: as G.711 (see above)
    "OPUS": CodecImpairment(ie=0.0, bpl=25.1),
}


def delay_impairment(delay_ms: float) -> float:
    """Id for a one-way mouth-to-ear delay in milliseconds."""
    d = max(0.0, delay_ms)
    return 0.024 * d + (0.11 * (d - 177.3) if d > 177.3 else 0.0)


def effective_equipment_impairment(loss_pct: float, codec: str = "PCMU", burst_ratio: float = 1.0) -> float:
    """Ie_eff for a packet loss percentage (0-100) on ``codec`` (unknown codecs count as G.711)."""
    params = CODEC_IMPAIRMENTS.get(codec.upper(), CODEC_IMPAIRMENTS["PCMU"])
    ppl = min(100.0, max(0.0, loss_pct))
    burst = max(1.0, burst_ratio)
    return params.ie + (95.0 - params.ie) * ppl / (ppl / burst + params.bpl)


def r_factor(*, loss_pct: float, delay_ms: float, codec: str = "PCMU", burst_ratio: float = 1.0) -> float:
    return R_DEFAULT - delay_impairment(delay_ms) - effective_equipment_impairment(loss_pct, codec, burst_ratio)


def mos_from_r(r: float) -> float:
    if r <= 0.0:
        return 1.0
    if r >= 100.0:
        return 4.5
    return 1.0 + 0.035 * r + r * (r - 60.0) * (100.0 - r) * 7e-6


def estimate_mos(*, loss_pct: float, delay_ms: float, codec: str = "PCMU", burst_ratio: float = 1.0) -> float:
    """MOS-CQE (1.0-4.5) for loss percentage, one-way delay and codec; rounded to 2 decimals."""
    r = r_factor(loss_pct=loss_pct, delay_ms=delay_ms, codec=codec, burst_ratio=burst_ratio)
    return round(max(1.0, mos_from_r(r)), 2)
