"""A live SIP call's snapshot as a worker reports it (``SipCalls.snapshot_of``'s shape: media figures, level
samples, no session), made up for the benchmarks that measure what carrying and storing snapshots costs
(`gateway bench stalls`, `gateway bench heartbeat`)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.models import CallSnapshot
from gateway.worker.reporting import build_snapshot, level_fields, media_fields


def live_sip_snapshot(
    number: int,
    *,
    worker: str,
    route: str,
    started: float,
    packets_in: int,
    packets_out: int,
    jitter_ms: float,
    level: float,
    levels: Sequence[float],
) -> CallSnapshot:
    """Call ``number`` of a synthetic PCMU load, answered half a second after ``started`` and still up."""
    stats = media_fields(
        packets_in=packets_in,
        packets_out=packets_out,
        lost=number % 3,
        loss_pct=0.1,
        jitter_ms=jitter_ms,
        late=1,
        concealed=3,
        underruns=1,
        delay_ms=80.0,
        codec="PCMU",
    )
    stats.update(level_fields(level, levels))
    return build_snapshot(
        call_id=f"c-{number:08x}",
        kind="sip",
        direction="inbound",
        from_="+15550100",
        to="+15550199",
        route=route,
        provider="openai",
        state="active",
        worker=worker,
        codec="PCMU",
        cost=1.0,
        started=started,
        answered=started + 0.5,
        ended=None,
        end_reason="",
        stats=stats,
        session=None,
    )
