"""The load generator over SDES SRTP against a real worker on loopback: every call offers RTP/SAVP, sends SRTP
and reads the worker's SRTP back; the echo must come back whole (markers, audio match, no loss)."""

from __future__ import annotations

import pytest

from gateway.loadtest.config import LoadConfig, LoadConfigError, TalkPattern
from gateway.loadtest.results import aggregate
from gateway.loadtest.runner import run_load
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.worker.settings import WorkerSettings
from gateway.worker.worker import MediaWorker
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("suite", ["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"])
async def test_srtp_calls_through_a_worker_echo_back_whole(suite: str) -> None:
    sip_port = free_ports(1)[0]
    rtp_low = free_ports(20)[0]
    rtp_low += rtp_low % 2
    worker = MediaWorker(
        WorkerSettings(worker_id="w-load", sip_port=sip_port, rtp_ports=f"{rtp_low}-{rtp_low + 19}", srtp="required"),
        model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)),
    )
    await worker.start()
    try:
        result = await run_load(
            LoadConfig(
                target=("127.0.0.1", sip_port),
                cps=20.0,
                calls=4,
                duration_s=3.0,
                audio="tone",
                talk=TalkPattern(talk_ms=400, pause_ms=600),
                rtp_ports=(35000, 35099),
                srtp=suite,
            )
        )
        dropped = dict(worker.engine.dropped)
    finally:
        await worker.aclose()
    s = aggregate(result)
    assert s["answered"] == 4 and s["completed"] == 4
    assert s["packets_lost"] == 0 and s["markers_found"] == s["markers_expected"] == 8
    assert s["audio_ok"] == 4
    assert not any(reason.startswith(("srtp_", "srtcp_")) for reason in dropped), dropped


def test_an_unknown_suite_is_refused_up_front() -> None:
    with pytest.raises(LoadConfigError, match="srtp must be one of"):
        LoadConfig(srtp="AEAD_AES_256_GCM")
