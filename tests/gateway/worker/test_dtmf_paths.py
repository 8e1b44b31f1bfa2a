"""Outbound DTMF's three paths and inbound in-band detection, with a real worker and a SIP peer on loopback:
RFC 4733 when telephone-event is negotiated, SIP INFO when it is not and the peer allows INFO, else tones that a
Goertzel detector decodes back; the caller's tones reach the call's DTMF only on calls without telephone-event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from gateway.sip import core
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import DtmfInfoReceived, OutboundCallAnswered
from gateway.worker.worker import MediaWorker
from telcodecs.dtmf import GoertzelDetector, tone
from tests.gateway.worker.sip_peer import PeerCall, SipPeer, echo_worker


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-dtmf", rtp_timeout_s=5.0) as w:
        yield w


async def _call(
    peer: SipPeer, worker: MediaWorker, monkeypatch: pytest.MonkeyPatch, *, telephone_event: bool, info: bool = True
) -> PeerCall:
    target = f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}"
    with monkeypatch.context() as m:
        if not info:  # the peer's INVITE then carries an Allow without INFO
            m.setattr(core, "ALLOWED_METHODS", tuple(x for x in core.ALLOWED_METHODS if x != "INFO"))
        call = peer.invite(target, telephone_event=telephone_event)
    event = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, event.body)  # type: ignore[attr-defined]
    return call


async def _until(predicate: Callable[[], bool], *, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def _log(worker: MediaWorker, direction: str) -> list[tuple[str, str | None]]:
    [call_id] = list(worker.legs)
    session = worker.legs.find(call_id).session
    assert session is not None
    return [(e.digit, e.method) for e in session.dtmf_log if e.direction == direction]


async def test_negotiated_telephone_event_sends_rfc4733(worker: MediaWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    async with SipPeer() as peer:
        call = await _call(peer, worker, monkeypatch, telephone_event=True)
        [leg_id] = list(worker.legs)
        await worker.send_dtmf(leg_id, "12")
        await peer.stream(call, np.zeros(8000, np.int16), frames=20)
        assert 101 in call.received_pts
        assert _log(worker, "sent") == [("1", "rfc4733"), ("2", "rfc4733")]


async def test_without_telephone_event_info_is_used_when_allowed(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SipPeer() as peer:
        call = await _call(peer, worker, monkeypatch, telephone_event=False)
        [leg_id] = list(worker.legs)
        await worker.send_dtmf(leg_id, "7#")
        got = [await peer.wait_for(DtmfInfoReceived, call=call.handle) for _ in range(2)]
        assert [e.digit for e in got] == ["7", "#"]  # type: ignore[attr-defined]
        assert _log(worker, "sent") == [("7", "info"), ("#", "info")]


async def test_without_telephone_event_or_info_tones_are_played(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SipPeer() as peer:
        call = await _call(peer, worker, monkeypatch, telephone_event=False, info=False)
        [leg_id] = list(worker.legs)
        await worker.send_dtmf(leg_id, "905*")
        await peer.stream(call, np.zeros(8000, np.int16), frames=50)  # 1 s: the four presses and their pauses
        assert 101 not in call.received_pts
        heard = [press.digit for press in GoertzelDetector(8000).feed(peer.heard(call))]
        assert heard == ["9", "0", "5", "*"]
        assert _log(worker, "sent") == [(d, "inband") for d in "905*"]


@pytest.mark.parametrize(
    ("telephone_event", "expected"),
    [(False, [("4", None), ("2", None), ("#", None)]), (True, [])],
    ids=["tones", "events"],
)
async def test_caller_tones_reach_the_call_only_without_telephone_event(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch, telephone_event: bool, expected: list[tuple[str, None]]
) -> None:
    pause = np.zeros(800, np.int16)
    keys = np.concatenate([np.concatenate([tone(d, duration_ms=100, sample_rate=8000), pause]) for d in "42#"])
    async with SipPeer() as peer:
        call = await _call(peer, worker, monkeypatch, telephone_event=telephone_event)
        await peer.stream(call, np.concatenate([pause, keys, pause, pause]))
        await _until(lambda: len(_log(worker, "received")) >= len(expected), within=3.0)
        assert _log(worker, "received") == expected


async def test_info_refused_by_the_dialog_state_falls_back_to_tones(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_yet(call: object, digit: str) -> None:
        raise LocalProtocolError("call is not established (state early)")

    async with SipPeer() as peer:
        call = await _call(peer, worker, monkeypatch, telephone_event=False)
        monkeypatch.setattr(worker.sip_calls._signalling, "send_dtmf_info", not_yet)
        [leg_id] = list(worker.legs)
        await worker.send_dtmf(leg_id, "3")
        await peer.stream(call, np.zeros(8000, np.int16), frames=20)
        assert [press.digit for press in GoertzelDetector(8000).feed(peer.heard(call))] == ["3"]
        assert _log(worker, "sent") == [("3", "inband")]
