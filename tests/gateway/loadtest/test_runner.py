"""The load generator end to end on loopback sockets, against a reflecting SIP peer (no gateway)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.loadtest.config import LoadConfig, TalkPattern
from gateway.loadtest.results import aggregate
from gateway.loadtest.runner import run_load
from gateway.transport.self_signed import ensure_self_signed
from gateway.transport.tls import SipTlsConfig, TlsContexts
from tests.gateway.loadtest.echo_peer import EchoPeer
from tests.support.procs import free_ports

PATTERN = TalkPattern(talk_ms=400, pause_ms=600)


async def _run(peer_kwargs: dict[str, int] | None = None, *, runs: int = 1, **config: object) -> dict[str, object]:
    """``runs`` load tests back to back against one peer; the summary is the last run's."""
    (port,) = free_ports(1)
    peer = EchoPeer(port=port, rtp_ports=(33000, 33199), **(peer_kwargs or {}))
    await peer.start()
    try:
        options: dict[str, object] = {
            "target": ("127.0.0.1", port),
            "cps": 20.0,
            "calls": 6,
            "duration_s": 3.0,
            "audio": "tone",
            "talk": PATTERN,
            "rtp_ports": (34000, 34199),
        }
        options.update(config)
        for _ in range(runs):
            result = await run_load(LoadConfig(**options))  # type: ignore[arg-type]
    finally:
        await peer.aclose()
    summary = aggregate(result)
    summary["_result"] = result
    summary["_peer"] = peer
    return summary


@pytest.mark.parametrize("codec", ["PCMU", "PCMA", "G722", "opus"])
async def test_reflected_calls_have_no_loss_markers_back_and_matching_audio(codec: str) -> None:
    s = await _run(codec=codec)
    assert s["calls"] == 6 and s["answered"] == 6 and s["completed"] == 6
    assert s["packets_lost"] == 0 and s["sequence_errors"] == 0
    assert s["markers_expected"] == 6 * 2 and s["markers_found"] == s["markers_expected"]
    assert s["audio_ok"] == 6
    rtt = s["rtt_ms"]
    assert 0 <= rtt["p50"] < 30 and rtt["max"] < 100  # a reflection on loopback: ~ one packet's transit
    setup = s["setup_ms"]
    assert setup["count"] == 6 and setup["max"] < 500
    assert s["packets_received"] >= 6 * 140  # 3 s at 50 packets/s, minus the hang-up edge
    assert s["pacing_error_ms"]["packets"] == s["packets_received"]
    # every packet carried the kernel's arrival stamp; the generator read it within a few ms on a quiet loop
    assert s["read_delay_ms"]["packets"] == s["packets_received"] and s["read_delay_ms"]["p50"] <= 5.0
    assert s["_peer"].ended == 6  # every call was hung up with a BYE the peer saw


async def test_tcp_signalling_works_too() -> None:
    s = await _run(transport="tcp", calls=2, cps=10.0)
    assert s["answered"] == 2 and s["packets_lost"] == 0 and s["audio_ok"] == 2


async def test_tls_signalling_verified_against_the_peers_certificate(tmp_path: Path) -> None:
    pair = ensure_self_signed(tmp_path, ("127.0.0.1",))
    port, tls_port = free_ports(2)
    contexts = TlsContexts(SipTlsConfig(cert_file=pair.cert_file, key_file=pair.key_file))
    peer = EchoPeer(port=port, rtp_ports=(33000, 33199), tls=contexts, tls_port=tls_port)
    await peer.start()
    try:
        config = LoadConfig(
            target=("127.0.0.1", tls_port),
            transport="tls",
            tls_ca=str(pair.cert_file),
            cps=10.0,
            calls=2,
            duration_s=2.0,
            audio="tone",
            talk=PATTERN,
            rtp_ports=(34000, 34199),
        )
        s = aggregate(await run_load(config))
    finally:
        await peer.aclose()
    assert s["answered"] == 2 and s["packets_lost"] == 0 and s["audio_ok"] == 2
    assert peer.ended == 2  # the BYEs came over TLS
    assert peer.sip.stats.tls_received >= 6 and peer.sip.stats.udp_received == 0 and peer.sip.stats.tcp_received == 0


async def test_loss_on_the_way_back_is_counted() -> None:
    s = await _run(peer_kwargs={"drop_every": 10}, calls=2)
    assert s["answered"] == 2
    assert s["loss_pct"] == pytest.approx(10.0, abs=1.5)
    assert s["calls_with_loss"] == 2


async def test_rejected_calls_are_failures_by_status() -> None:
    s = await _run(peer_kwargs={"reject": 486}, calls=3)
    assert s["answered"] == 0 and s["statuses"] == {"486": 3}
    assert s["success_rate"] == 0.0 and math.isnan(s["loss_pct"])


async def test_total_calls_beyond_the_concurrency_ceiling_wait_for_a_free_slot() -> None:
    s = await _run(calls=2, total=4, cps=50.0, duration_s=1.0)
    assert s["answered"] == 4 and s["max_concurrent"] <= 2
    result = s["_result"]
    third = sorted(result.calls, key=lambda c: c.placed_s)[2]
    assert third.placed_s >= 0.9  # it waited for one of the first two to end


async def test_back_to_back_runs_use_new_call_ids_and_are_all_answered() -> None:
    # The audio plans follow --seed; SIP identifiers must not, or a second run within 32 s of the first
    # repeats (From tag, Call-ID, CSeq) and a correct target answers 482 Loop Detected.
    summary = await _run(runs=2, calls=4, duration_s=1.0, audio="silence", analyze=False)
    peer = summary["_peer"]
    assert isinstance(peer, EchoPeer)
    assert summary["answered"] == 4  # the second run; the peer answers every offer it gets
    assert len(peer.call_ids) == 8 and len(set(peer.call_ids)) == 8 and peer.offers == 8


async def test_the_collector_is_off_while_the_calls_run_and_back_on_after(monkeypatch: pytest.MonkeyPatch) -> None:
    # A collector pass stalls the generator's clock (42 ms measured at 100 calls): every call's RTP then
    # leaves in a burst. The run switches it off and collects once the calls are over.
    import gc

    from gateway.loadtest.runner import LoadRunner

    seen: list[bool] = []
    on_tick = LoadRunner._on_tick

    def probe(self: LoadRunner, deadline: float) -> None:
        seen.append(gc.isenabled())
        on_tick(self, deadline)

    monkeypatch.setattr(LoadRunner, "_on_tick", probe)
    assert gc.isenabled()
    s = await _run(calls=2, duration_s=1.0)
    assert s["answered"] == 2 and len(seen) >= 50
    assert not any(seen)
    assert gc.isenabled()
