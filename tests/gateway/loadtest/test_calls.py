"""The load generator's UAC call flow against an in-memory SipEndpoint peer, under a fake clock."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from gateway.loadtest.calls import LoadCall, LoadCalls
from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import CallEnded, CallOffered, SipEvent
from gateway.sip.sdp import LocalMedia, build_answer, negotiate, parse_sdp

UAC = ("127.0.0.1", 5080)
UAS = ("127.0.0.1", 5060)


@dataclass
class Peer:
    """A UAS that answers (or rejects with ``status``) after ``delay`` seconds of fake time."""

    endpoint: SipEndpoint
    status: int = 200
    delay: float = 0.0
    pending: list[tuple[float, CallOffered]] = field(default_factory=list)
    offered: list[CallOffered] = field(default_factory=list)
    ended: list[CallEnded] = field(default_factory=list)

    def on_events(self, events: list[SipEvent], now: float) -> None:
        for event in events:
            if isinstance(event, CallOffered):
                self.pending.append((now + self.delay, event))
                self.offered.append(event)
            elif isinstance(event, CallEnded):
                self.ended.append(event)

    def act(self, now: float) -> None:
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _, offer in due:
            if self.status != 200:
                self.endpoint.reject(offer.call, now, status=self.status)
                continue
            sdp = parse_sdp(offer.body)
            negotiated = negotiate(sdp, local=LocalMedia())
            answer = build_answer(
                sdp, negotiated, local_address="127.0.0.1", local_port=30000, session_id=1, session_version=1
            )
            self.endpoint.answer(offer.call, now, body=answer.to_bytes())


class World:
    def __init__(self, *, status: int = 200, delay: float = 0.0, duration: float = 5.0, timeout: float = 3.0) -> None:
        self.now = 100.0
        self.uac = SipEndpoint(SipConfig(local_port=UAC[1], rate_limit=None), rng=random.Random(1))
        self.peer = Peer(
            SipEndpoint(SipConfig(local_port=UAS[1], rate_limit=None), rng=random.Random(2)), status, delay
        )
        self.answered: list[tuple[LoadCall, float]] = []
        self.ended: list[tuple[LoadCall, float]] = []
        self.calls = LoadCalls(
            self.uac,
            target=UAS,
            transport="udp",
            codec="PCMU",
            duration_s=duration,
            setup_timeout_s=timeout,
            on_answered=lambda call, now: self.answered.append((call, now)),
            on_ended=lambda call, now: self.ended.append((call, now)),
            rng=random.Random(3),
        )

    def pump(self) -> None:
        for _ in range(100):
            moved = False
            for src, endpoint, dst in ((UAC, self.uac, self.peer.endpoint), (UAS, self.peer.endpoint, self.uac)):
                for out in endpoint.datagrams():
                    moved = True
                    dst.receive(out.data, src, transport="udp", now=self.now)
            uac_events = self.uac.events()
            uas_events = self.peer.endpoint.events()
            self.calls.on_events(uac_events, self.now)
            self.peer.on_events(uas_events, self.now)
            self.peer.act(self.now)
            if not moved and not uac_events and not uas_events:
                return

    def advance(self, seconds: float, step: float = 0.01) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = round(self.now + step, 6)
            self.calls.handle_timers(self.now)
            for endpoint in (self.uac, self.peer.endpoint):
                deadline = endpoint.next_deadline()
                if deadline is not None and deadline <= self.now:
                    endpoint.handle_timers(self.now)
            self.pump()


def test_answered_call_measures_setup_negotiates_and_hangs_up_after_its_duration() -> None:
    world = World(delay=0.05, duration=5.0)
    call = world.calls.place(0, rtp_host="127.0.0.1", rtp_port=40000, now=world.now)
    world.pump()
    world.advance(0.2)
    assert [c.index for c, _ in world.answered] == [0]
    assert call.phase == "up" and call.status == 200
    assert call.setup_s == pytest.approx(0.05, abs=0.011)
    assert call.negotiated is not None
    assert call.negotiated.codec_name == "PCMU" and call.negotiated.remote_rtp == ("127.0.0.1", 30000)
    world.advance(4.7)
    assert call.phase == "up", "hung up before its duration"
    world.advance(0.2)
    assert call.phase == "done" and call.outcome == "completed" and call.ended_by == "local"
    assert world.ended and world.ended[0][0] is call
    world.advance(0.1)
    assert [e.by for e in world.peer.ended] == ["remote"], "the peer saw our BYE"
    assert world.calls.active == 0 and world.calls.finished == [call]


def test_offer_names_only_the_chosen_codec_and_telephone_event() -> None:
    world = World()
    world.calls.place(7, rtp_host="127.0.0.1", rtp_port=40002, now=world.now)
    sent = [out.data for out in world.uac.datagrams()]
    assert len(sent) == 1 and sent[0].startswith(b"INVITE sip:agent@127.0.0.1:5060 SIP/2.0")
    body = sent[0].split(b"\r\n\r\n", 1)[1]
    assert b"m=audio 40002 RTP/AVP 0 101\r\n" in body
    assert b"PCMA" not in body and b"opus" not in body
    assert b"From: <sip:load7@127.0.0.1>" in sent[0]


def test_rejected_call_reports_its_status() -> None:
    world = World(status=486)
    call = world.calls.place(0, rtp_host="127.0.0.1", rtp_port=40000, now=world.now)
    world.advance(0.1)
    assert call.phase == "done" and call.outcome == "failed" and call.status == 486
    assert call.answered_at is None and not world.answered
    assert world.ended[0][0] is call


def test_unanswered_call_is_cancelled_at_the_setup_timeout() -> None:
    world = World(delay=60.0, timeout=2.0)
    call = world.calls.place(0, rtp_host="127.0.0.1", rtp_port=40000, now=world.now)
    world.advance(1.9)
    assert call.phase == "inviting"
    world.advance(0.2)
    assert call.phase == "done" and call.outcome == "timeout" and call.answered_at is None


def test_far_end_hang_up_marks_the_call_dropped() -> None:
    world = World(duration=10.0)
    call = world.calls.place(0, rtp_host="127.0.0.1", rtp_port=40000, now=world.now)
    world.advance(0.5)
    assert call.phase == "up"
    (offered,) = world.peer.offered
    world.peer.endpoint.hang_up(offered.call, world.now)
    world.pump()
    assert call.phase == "done" and call.outcome == "dropped" and call.ended_by == "remote"
