"""MidCall (gateway/worker/sip_midcall.py) with real offer/answer on both sides and recording ports: who holds the
call, what the session and the control plane are told, and why a hold or resume is refused."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gateway.fleet.errors import CommandRejectedError
from gateway.sip.events import CallHandle, ReinviteAcked, ReinviteAnswered, ReinviteFailed, ReinviteReceived
from gateway.sip.offer_answer import OfferAnswer, OfferAnswerState
from gateway.worker.legs import LegState
from gateway.worker.sip_leg import CallLeg
from gateway.worker.sip_midcall import MidCall
from gateway.worker.slices import CapacitySettings
from tests.gateway.sip.test_offer_answer import answered, side


class Signalling:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def reinvite(self, call: CallHandle, body: bytes) -> None:
        self.sent.append(("reinvite", body))

    def answer_reinvite(self, call: CallHandle, body: bytes) -> None:
        self.sent.append(("answer", body))

    def reject_reinvite(self, call: CallHandle, status: int, reason: str | None = None) -> None:
        self.sent.append(("reject", str(status).encode()))


class Engine:
    def __init__(self) -> None:
        self.directions: list[str] = []

    def set_direction(self, call_id: str, direction: str) -> None:
        self.directions.append(direction)

    def update_remote(self, call_id: str, remote_rtp: Any, remote_rtcp: Any = None) -> None:
        pass

    def set_srtp(self, call_id: str, config: Any) -> None:
        pass


class Session:
    def __init__(self) -> None:
        self.held: str | None = None
        self.changes: list[tuple[bool, str]] = []

    def set_held(self, held: bool, *, by: str) -> bool:
        self.held = by if held else None
        self.changes.append((held, by))
        return True


class Fixture:
    def __init__(self) -> None:
        self.signalling, self.engine, self.session = Signalling(), Engine(), Session()
        self.reports: list[str] = []
        self.midcall = MidCall(
            signalling=cast(Any, self.signalling),
            engine=cast(Any, self.engine),
            costs=CapacitySettings(),
            report=lambda kind, leg: self.reports.append(kind),
        )
        self.phone, self.gateway = side(1, srtp="off"), side(2, srtp="off")
        answered(self.gateway.answer(self.phone.offer().to_bytes()))
        assert self.gateway.local is not None
        answered(self.phone.take_answer(self.gateway.local.to_bytes()))
        self.handle = cast(CallHandle, object())
        leg = CallLeg(id="c1", sip=self.handle, direction="inbound", from_uri="", to_uri="", owner=cast(Any, None))
        leg.sdp, leg.session, leg.media_added, leg.rtp = self.gateway, cast(Any, self.session), True, cast(Any, 1)
        leg.state = LegState.ACTIVE
        self.leg = leg

    def phone_answers(self, oa: OfferAnswer | None = None) -> None:
        """The phone answers our last re-INVITE."""
        kind, body = self.signalling.sent[-1]
        assert kind == "reinvite"
        answered(self.phone.update(body))
        assert self.phone.local is not None
        self.midcall.reinvite_answered(
            self.leg, ReinviteAnswered(call=self.handle, method="INVITE", body=self.phone.local.to_bytes())
        )


def test_the_gateway_holds_and_resumes_and_says_why_it_cannot() -> None:
    f = Fixture()
    with pytest.raises(CommandRejectedError, match="does not hold"):
        f.midcall.start_hold(f.leg, False)
    f.midcall.start_hold(f.leg, True)
    assert b"a=sendonly" in f.signalling.sent[-1][1]
    with pytest.raises(CommandRejectedError, match="awaits its answer"):
        f.midcall.start_hold(f.leg, True)
    f.phone_answers()
    assert f.leg.state is LegState.HELD and f.session.changes == [(True, "gateway")]
    assert f.engine.directions == ["sendonly"] and f.reports == ["call.held"]
    with pytest.raises(CommandRejectedError, match="on hold already \\(by the gateway\\)"):
        f.midcall.start_hold(f.leg, True)

    # The phone refreshes meanwhile (sendrecv): our answer keeps the hold, and the gateway's hold stands.
    offer = f.phone.offer(direction="sendrecv").to_bytes()
    f.midcall.reinvite_received(
        f.leg, ReinviteReceived(call=f.handle, method="INVITE", body=offer, content_type="application/sdp")
    )
    assert b"a=sendonly" in f.signalling.sent[-1][1] and f.leg.state is LegState.HELD
    answered(f.phone.take_answer(f.signalling.sent[-1][1]))
    assert f.session.changes == [(True, "gateway")]

    # A refused resume leaves the hold as it was.
    f.midcall.start_hold(f.leg, False)
    assert b"a=sendrecv" in f.signalling.sent[-1][1]
    f.midcall.reinvite_failed(f.leg, ReinviteFailed(call=f.handle, method="INVITE", status=488, reason="No"))
    assert f.gateway.state is OfferAnswerState.NEGOTIATED and f.gateway.wish == "sendonly"
    assert f.leg.state is LegState.HELD and f.leg.hold_pending is None

    f.midcall.start_hold(f.leg, False)
    f.phone_answers()
    assert f.leg.state is LegState.ACTIVE and f.session.changes == [(True, "gateway"), (False, "gateway")]
    assert f.reports == ["call.held", "call.resumed"]


def test_the_callers_hold_is_theirs_to_end() -> None:
    f = Fixture()
    offer = f.phone.offer(direction="sendonly").to_bytes()
    f.midcall.reinvite_received(
        f.leg, ReinviteReceived(call=f.handle, method="INVITE", body=offer, content_type="application/sdp")
    )
    assert f.leg.state is LegState.HELD and f.session.changes == [(True, "caller")]
    with pytest.raises(CommandRejectedError, match="by the caller"):
        f.midcall.start_hold(f.leg, True)
    with pytest.raises(CommandRejectedError, match="does not hold"):
        f.midcall.start_hold(f.leg, False)


def test_the_answer_in_the_ack_of_an_offerless_reinvite_is_taken() -> None:
    f = Fixture()
    f.midcall.reinvite_received(f.leg, ReinviteReceived(call=f.handle, method="INVITE", body=None, content_type=None))
    kind, our_offer = f.signalling.sent[-1]
    assert kind == "answer" and f.gateway.state is OfferAnswerState.REOFFERED
    # The phone answers our offer in its ACK, putting the call on hold (it answers sendonly to sendrecv).
    f.phone.offer(direction="sendonly")  # its wish to hold; its own re-offer gives way to ours
    answered(f.phone.update(our_offer))
    assert f.phone.local is not None
    f.midcall.reinvite_acked(f.leg, ReinviteAcked(call=f.handle, body=f.phone.local.to_bytes()))
    assert f.gateway.state is OfferAnswerState.NEGOTIATED
    assert f.leg.state is LegState.HELD and f.session.changes == [(True, "caller")]
    assert f.engine.directions[-1] == "recvonly"
