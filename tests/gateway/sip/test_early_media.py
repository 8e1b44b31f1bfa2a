"""Early media in the SIP core: our 183 with the SDP answer (same To tag, same SDP as the 200), 100rel accepted
(test_prack.py), and 18x with SDP on our INVITE (the events carry what the worker needs; EarlyDialogs picks the
fork)."""

from __future__ import annotations

import pytest

from gateway.sip.early_media import EarlyDialogs
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import CallEstablished, CallOffered, OutboundCallAnswered, OutboundCallProgressed
from gateway.sip.message import SipRequest, make_response, parse_message
from gateway.sip.offer_answer import OfferAnswer, OfferAnswerState
from tests.gateway.sip.test_calls import ANSWER, OFFER, setup
from tests.gateway.sip.test_offer_answer import answered, side
from tests.gateway.sip.test_torture import answer_of, endpoint, request


def _offered(net, a, b, *, body: bytes = OFFER):  # type: ignore[no-untyped-def]
    call_a = a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=body)
    return call_a, net.of_type(b, CallOffered)[-1].call


def _responses(net, status: int) -> list:  # type: ignore[no-untyped-def]
    return [parse_message(d.data) for d in net.log if d.start_line.startswith(f"SIP/2.0 {status}")]


def test_183_carries_the_answer_and_the_200_the_same_answer_and_to_tag() -> None:
    net, a, b = setup()
    call_a, call_b = _offered(net, a, b)
    b.ring(call_b, net.now, status=183, body=ANSWER)
    net.pump()
    b.answer(call_b, net.now, body=ANSWER)
    net.pump()
    (progress,) = _responses(net, 183)
    (ok,) = _responses(net, 200)
    assert progress.body == ANSWER and progress.content_type == "application/sdp"
    assert progress.reason == "Session Progress"
    assert progress.to.tag and progress.to.tag == ok.to.tag  # one early dialog, confirmed by the 200
    assert ok.body == progress.body
    progressed = net.of_type(a, OutboundCallProgressed)
    assert progressed == [
        OutboundCallProgressed(
            call=call_a,
            status=183,
            reason="Session Progress",
            body=ANSWER,
            content_type="application/sdp",
            to_tag=progress.to.tag,
        )
    ]
    answered = net.of_type(a, OutboundCallAnswered)
    assert answered == [
        OutboundCallAnswered(call=call_a, body=ANSWER, content_type="application/sdp", to_tag=progress.to.tag)
    ]
    assert net.of_type(b, CallEstablished) == [CallEstablished(call=call_b, body=b"")]


def test_a_200_with_another_answer_than_the_183_is_our_bug() -> None:
    net, a, b = setup()
    _, call_b = _offered(net, a, b)
    b.ring(call_b, net.now, status=183, body=ANSWER)
    with pytest.raises(LocalProtocolError, match="same answer as the 183"):
        b.answer(call_b, net.now, body=ANSWER.replace(b"5000", b"5002"))
    with pytest.raises(LocalProtocolError, match="second 183"):
        b.ring(call_b, net.now, status=183, body=ANSWER.replace(b"5000", b"5002"))
    b.ring(call_b, net.now, status=183, body=ANSWER)  # the same answer again is fine (a repeated 183)
    b.answer(call_b, net.now, body=ANSWER)
    net.pump()
    assert len(_responses(net, 183)) == 2 and len(_responses(net, 200)) == 1


def test_an_invite_without_an_offer_gets_no_early_media() -> None:
    net, a, b = setup()
    _, call_b = _offered(net, a, b, body=b"")
    with pytest.raises(LocalProtocolError, match="without an offer"):
        b.ring(call_b, net.now, status=183, body=ANSWER)
    b.ring(call_b, net.now)  # 180 without a body stays possible
    net.pump()
    assert len(_responses(net, 180)) == 1 and _responses(net, 183) == []


def test_require_100rel_is_accepted_no_more_420() -> None:
    ep = endpoint()
    accepted = answer_of(ep, request(method="INVITE", extra="Require: 100rel\r\n", body=OFFER.decode()))
    assert accepted is not None and accepted.status == 100  # reliable 18x follow (test_prack.py)
    ep = endpoint()
    trying = answer_of(
        ep, request(method="INVITE", extra="Supported: 100rel, timer\r\n", body=OFFER.decode(), branch="z9hG4bKt2")
    )
    assert trying is not None and trying.status == 100


def _fork_response(invite: SipRequest, status: int, tag: str, body: bytes = b"") -> bytes:
    headers = (("Contact", "<sip:fork@127.0.0.1:5062>"),)
    if body:
        headers += (("Content-Type", "application/sdp"),)
    return make_response(invite, status, to_tag=tag, headers=headers, body=body).encode()


def test_forked_18x_each_name_their_early_dialog_and_the_answering_fork_is_told() -> None:
    net, a, _ = setup()
    call_a = a.invite("sip:agent@127.0.0.1:5063", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=OFFER)
    out = a.datagrams()
    invite = parse_message(out[-1].data)
    assert isinstance(invite, SipRequest)
    fork = ("127.0.0.1", 5063)
    a.receive(_fork_response(invite, 183, "one", ANSWER), fork, transport="udp", now=0.0)
    a.receive(_fork_response(invite, 183, "two", ANSWER.replace(b"5000", b"5002")), fork, transport="udp", now=0.0)
    a.receive(_fork_response(invite, 200, "two", ANSWER.replace(b"5000", b"5002")), fork, transport="udp", now=0.0)
    events = a.events()
    progressed = [e for e in events if isinstance(e, OutboundCallProgressed)]
    assert [(e.to_tag, e.body) for e in progressed] == [("one", ANSWER), ("two", ANSWER.replace(b"5000", b"5002"))]
    (answered,) = [e for e in events if isinstance(e, OutboundCallAnswered)]
    assert answered.call == call_a and answered.to_tag == "two"


def test_early_dialogs_first_sdp_starts_the_media_and_the_answer_decides() -> None:
    early = EarlyDialogs()
    assert early.progressed(body=b"", content_type=None, to_tag="one") == "ignore"  # 180 without SDP
    assert early.progressed(body=ANSWER, content_type="application/sdp", to_tag=None) == "ignore"  # no dialog
    assert early.progressed(body=ANSWER, content_type="text/plain", to_tag="one") == "ignore"
    assert not early.started
    assert early.progressed(body=ANSWER, content_type="application/sdp", to_tag="one") == "start"
    assert early.progressed(body=ANSWER, content_type="application/sdp", to_tag="one") == "ignore"  # a repeat
    assert early.progressed(body=OFFER, content_type="application/sdp", to_tag="two") == "ignore"  # another fork
    assert early.started and early.to_tag == "one" and early.ignored == 2
    assert early.answered(body=ANSWER, to_tag="one") == "keep"
    assert early.answered(body=b"", to_tag="one") == "keep"  # a 2xx that leaves the answer out keeps the 183's
    assert early.answered(body=OFFER, to_tag="one") == "take"  # changed at answer (RFC 6337 §3.1.1)
    assert early.answered(body=ANSWER, to_tag="two") == "take"  # another fork answered
    assert EarlyDialogs().answered(body=ANSWER, to_tag="one") == "take"  # no early media: as always


def test_offer_answer_early_answer_then_confirmed_or_replaced() -> None:
    ours, theirs, moved = side(1), side(2), side(3)
    offer = ours.offer().to_bytes()
    answered(theirs.answer(offer))
    answered(moved.answer(offer))
    assert theirs.local is not None and moved.local is not None
    early = answered(ours.take_answer(theirs.local.to_bytes(), early=True))
    assert ours.state is OfferAnswerState.EARLY and early.media.remote_rtp == ("192.0.2.2", 40004)
    with pytest.raises(LocalProtocolError):
        ours.take_answer(theirs.local.to_bytes(), early=True)  # one early answer (EarlyDialogs ignores the rest)
    ours.confirm_early()
    assert ours.state is OfferAnswerState.NEGOTIATED and ours.media == early.media
    again = side(1)
    offer = again.offer().to_bytes()
    answered(again.take_answer(answered_local(side(2), offer), early=True))
    final = answered(again.take_answer(answered_local(side(3), offer)))  # another fork answered
    assert again.state is OfferAnswerState.NEGOTIATED and final.changed
    assert final.media.remote_rtp == ("192.0.2.3", 40006)
    with pytest.raises(LocalProtocolError):
        again.confirm_early()


def answered_local(peer: OfferAnswer, offer: bytes) -> bytes:
    answered(peer.answer(offer))
    assert peer.local is not None
    return peer.local.to_bytes()
