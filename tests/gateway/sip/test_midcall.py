"""Mid-call features between two in-memory SipEndpoints: re-INVITE/UPDATE hold, session timers, OPTIONS,
INFO DTMF, REFER (declined by the application, and tracked through NOTIFY sipfrag with a scripted peer)."""

from __future__ import annotations

from gateway.sip.config import SessionTimerConfig
from gateway.sip.events import (
    CallEnded,
    CallOffered,
    DtmfInfoReceived,
    OptionsAnswered,
    OptionsReceived,
    OutboundCallAnswered,
    ReferReceived,
    ReinviteAcked,
    ReinviteAnswered,
    ReinviteFailed,
    ReinviteReceived,
    SessionRefreshed,
    TransferDeclined,
    TransferFailed,
    TransferProgressed,
)
from gateway.sip.message import SipRequest, SipResponse, make_response, parse_message
from tests.gateway.sip.sipnet import DropFirst, Net
from tests.gateway.sip.test_calls import A_ADDR, ANSWER, B_ADDR, OFFER, place_call, setup

HOLD = OFFER + b"a=sendonly\r\n"
HELD = ANSWER + b"a=recvonly\r\n"


def test_reinvite_hold_and_unhold() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.reinvite(call_a, net.now, body=HOLD)
    net.pump()
    received = net.of_type(b, ReinviteReceived)
    assert received == [ReinviteReceived(call=call_b, method="INVITE", body=HOLD, content_type="application/sdp")]
    b.answer_reinvite(call_b, net.now, body=HELD)
    net.pump()
    assert net.of_type(a, ReinviteAnswered) == [ReinviteAnswered(call=call_a, method="INVITE", body=HELD)]
    assert net.lines()[-4:] == [
        "INVITE sip:gateway@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 100 Trying",
        "SIP/2.0 200 OK",
        "ACK sip:gateway@127.0.0.1:5062 SIP/2.0",
    ]
    # unhold from the other side, with UPDATE this time
    b.update(call_b, net.now, body=ANSWER)
    net.pump()
    assert net.of_type(a, ReinviteReceived)[-1] == ReinviteReceived(
        call=call_a, method="UPDATE", body=ANSWER, content_type="application/sdp"
    )
    a.answer_reinvite(call_a, net.now, body=OFFER)
    net.pump()
    assert net.of_type(b, ReinviteAnswered) == [ReinviteAnswered(call=call_b, method="UPDATE", body=OFFER)]
    net.advance(40_000)  # the re-INVITE's 2xx was ACKed: no retransmission keeps going, the call lives on
    assert net.of_type(a, CallEnded) == [] and net.of_type(b, CallEnded) == []


def test_reinvite_glare_gets_491_and_rejection_keeps_the_call() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.reinvite(call_a, net.now, body=HOLD)
    b.reinvite(call_b, net.now, body=HOLD)
    net.pump()
    assert {e.status for e in net.of_type(a, ReinviteFailed) + net.of_type(b, ReinviteFailed)} == {491}  # type: ignore[attr-defined]
    a.reinvite(call_a, net.now, body=HOLD)
    net.pump()
    b.reject_reinvite(call_b, net.now, status=488)
    net.pump()
    assert net.of_type(a, ReinviteFailed)[-1] == ReinviteFailed(
        call=call_a, method="INVITE", status=488, reason="Not Acceptable Here"
    )
    assert net.lines()[-1] == "ACK sip:gateway@127.0.0.1:5062 SIP/2.0"  # non-2xx ACK by the transaction


def test_session_timer_refresh_by_the_uas_then_expiry_when_refreshes_stop() -> None:
    net, a, b = setup()
    for endpoint in (a, b):
        assert endpoint.config.session_timer.session_expires == 1800
    call_a, call_b = place_call(net, a, b)
    ok = parse_message(next(d.data for d in net.log if d.start_line == "SIP/2.0 200 OK"))
    assert ok.headers.get("Session-Expires") == "1800;refresher=uas"
    assert ok.headers.get("Require") == "timer"
    net.advance(899_000)
    assert net.of_type(b, SessionRefreshed) == []
    net.advance(1_000)  # B (the refresher) refreshes at half the interval, with UPDATE since A allows it
    assert net.lines()[-2:] == ["UPDATE sip:gateway@127.0.0.1:5061 SIP/2.0", "SIP/2.0 200 OK"]
    assert net.of_type(b, SessionRefreshed) == [SessionRefreshed(call=call_b, interval=1800, by="local")]
    assert net.of_type(a, SessionRefreshed) == [SessionRefreshed(call=call_a, interval=1800, by="remote")]
    # From now on B's datagrams are lost: A must end the call at 1800 - min(32, 1800/3) after the refresh.
    net.drop = lambda source, out: source == B_ADDR
    net.advance(1_767_999)
    assert net.of_type(a, CallEnded) == []
    net.advance(1)
    assert net.of_type(a, CallEnded) == [CallEnded(call=call_a, reason="session expired", by="local", status=408)]
    assert net.lines(source=A_ADDR)[-1] == "BYE sip:gateway@127.0.0.1:5062 SIP/2.0"


def test_session_timer_422_retry_with_min_se() -> None:
    net = Net()
    a = net.add(5061, session_timer=SessionTimerConfig(session_expires=90))
    b = net.add(5062, session_timer=SessionTimerConfig(session_expires=600, min_se=300))
    _call_a, _call_b = place_call(net, a, b)
    lines = net.lines()
    assert lines[:4] == [
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 422 Session Interval Too Small",
        "ACK sip:agent@127.0.0.1:5062 SIP/2.0",
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
    ]
    retry = parse_message(net.log[3].data)
    assert retry.headers.get("Session-Expires") == "300" and retry.cseq.number == 2
    assert len(net.of_type(a, OutboundCallAnswered)) == 1
    ok = parse_message(next(d.data for d in net.log if d.start_line == "SIP/2.0 200 OK"))
    assert ok.headers.get("Session-Expires") == "300;refresher=uas"


def test_refresher_uac_refreshes_with_reinvite_when_update_is_not_allowed() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    call = a._core.calls[call_a]  # white-box: make A the refresher (not B) and hide UPDATE support
    other = b._core.calls[call_b]
    assert call.session_timer is not None and other.session_timer is not None
    call.session_timer.we_refresh, other.session_timer.we_refresh = True, False
    call.peer_allow = frozenset({"invite", "ack", "bye"})
    net.advance(900_000)
    assert "INVITE sip:gateway@127.0.0.1:5062 SIP/2.0" in net.lines(source=A_ADDR)[-3:]
    received = net.of_type(b, ReinviteReceived)
    assert received and received[-1].body == OFFER  # type: ignore[attr-defined]
    b.answer_reinvite(call_b, net.now, body=ANSWER)
    net.pump()
    assert net.of_type(a, SessionRefreshed)[-1] == SessionRefreshed(call=call_a, interval=1800, by="local")


def test_options_out_of_and_inside_a_dialog() -> None:
    net, a, b = setup()
    request_id = a.send_options("sip:127.0.0.1:5062", net.now)
    net.pump()
    assert net.of_type(a, OptionsAnswered) == [OptionsAnswered(request_id=request_id, status=200)]
    assert net.of_type(b, OptionsReceived) == [OptionsReceived(call=None, source=A_ADDR)]
    ok = parse_message(net.log[-1].data)
    assert "INVITE" in (ok.headers.get("Allow") or "") and ok.headers.get("Accept") == "application/sdp"
    call_a, call_b = place_call(net, a, b)
    dialog = a._core.calls[call_a].dialog
    assert dialog is not None
    options = dialog.build_request("OPTIONS", via=a._core.via("udp"))
    b.receive(options.encode(), A_ADDR, transport="udp", now=net.now)
    response = parse_message(b.datagrams()[-1].data)
    assert isinstance(response, SipResponse) and response.status == 200
    assert net.of_type(b, OptionsReceived)[-1] == OptionsReceived(call=call_b, source=A_ADDR)
    unanswered = a.send_options("sip:127.0.0.1:5999", net.now)
    net.advance(32_000)
    assert net.of_type(a, OptionsAnswered)[-1] == OptionsAnswered(request_id=unanswered, status=408)


def test_a_draining_endpoint_answers_health_options_503_but_keeps_its_calls() -> None:
    net, a, b = setup()
    call_a, _ = place_call(net, a, b)
    b.set_accepting_calls(False)
    request_id = a.send_options("sip:127.0.0.1:5062", net.now)
    net.pump()
    assert net.of_type(a, OptionsAnswered)[-1] == OptionsAnswered(request_id=request_id, status=503)
    dialog = a._core.calls[call_a].dialog
    assert dialog is not None
    options = dialog.build_request("OPTIONS", via=a._core.via("udp"))
    b.receive(options.encode(), A_ADDR, transport="udp", now=net.now)
    response = parse_message(b.datagrams()[-1].data)
    assert isinstance(response, SipResponse) and response.status == 200  # the call in progress is fine
    b.set_accepting_calls(True)
    request_id = a.send_options("sip:127.0.0.1:5062", net.now)
    net.pump()
    assert net.of_type(a, OptionsAnswered)[-1] == OptionsAnswered(request_id=request_id, status=200)


def test_info_dtmf() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.send_dtmf_info(call_a, net.now, digit="5", duration_ms=160)
    a.send_dtmf_info(call_a, net.now, digit="#", duration_ms=250)
    net.pump()
    assert net.of_type(b, DtmfInfoReceived) == [
        DtmfInfoReceived(call=call_b, digit="5", duration_ms=160),
        DtmfInfoReceived(call=call_b, digit="#", duration_ms=250),
    ]
    assert net.lines()[-2:] == ["SIP/2.0 200 OK", "SIP/2.0 200 OK"]


def test_incoming_refer_is_declined() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.refer(call_a, net.now, target_uri="sip:human@127.0.0.1:5070")
    net.pump()
    assert [e.refer_to for e in net.of_type(b, ReferReceived)] == ["sip:human@127.0.0.1:5070"]  # type: ignore[attr-defined]
    b.decline_refer(call_b, net.now)
    net.pump()
    assert net.of_type(a, TransferFailed) == [TransferFailed(call=call_a, status=603, reason="Decline")]
    assert net.of_type(b, TransferDeclined) == []  # the application declined it: the core has nothing to say


def _scripted_peer_call(net: Net) -> tuple[object, object, SipRequest]:
    """Endpoint A calls a scripted peer at 127.0.0.1:5070 that answers by hand."""
    a = net.add(5061)
    call = a.invite("sip:peer@127.0.0.1:5070", net.now, from_uri="<sip:a@127.0.0.1:5061>", body=OFFER)
    invite = parse_message(a.datagrams()[0].data)
    assert isinstance(invite, SipRequest)
    ok = make_response(invite, 200, to_tag="peer1", headers=(("Contact", "<sip:peer@127.0.0.1:5070>"),), body=ANSWER)
    a.receive(ok.encode(), ("127.0.0.1", 5070), transport="udp", now=net.now)
    assert [o.data.split(b" ")[0] for o in a.datagrams()] == [b"ACK"]
    return a, call, invite


def test_refer_accepted_and_tracked_through_notify_sipfrag() -> None:
    net = Net()
    a, call, _ = _scripted_peer_call(net)
    a.refer(call, net.now, target_uri="sip:human@127.0.0.1:5080")  # type: ignore[attr-defined]
    refer = parse_message(a.datagrams()[0].data)  # type: ignore[attr-defined]
    assert isinstance(refer, SipRequest) and refer.method == "REFER"
    assert refer.headers.get("Refer-To") == "<sip:human@127.0.0.1:5080>"
    a.receive(make_response(refer, 202).encode(), ("127.0.0.1", 5070), transport="udp", now=net.now)  # type: ignore[attr-defined]

    def notify(cseq: int, frag: bytes, state: str) -> SipResponse:
        request = SipRequest(method="NOTIFY", uri=refer.contacts[0].uri)
        for name, value in (
            ("Via", "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKn" + str(cseq)),
            ("From", f"{refer.headers.get('To')}"),
            ("To", f"{refer.headers.get('From')}"),
            ("Call-ID", refer.call_id),
            ("CSeq", f"{cseq} NOTIFY"),
            ("Event", "refer"),
            ("Subscription-State", state),
            ("Content-Type", "message/sipfrag;version=2.0"),
        ):
            request.headers.add(name, value)
        request.body = frag
        a.receive(request.encode(), ("127.0.0.1", 5070), transport="udp", now=net.now)  # type: ignore[attr-defined]
        response = parse_message(a.datagrams()[-1].data)  # type: ignore[attr-defined]
        assert isinstance(response, SipResponse)
        return response

    assert notify(10, b"SIP/2.0 100 Trying\r\n", "active;expires=60").status == 200
    assert notify(11, b"SIP/2.0 180 Ringing\r\n", "active;expires=60").status == 200
    assert notify(12, b"SIP/2.0 200 OK\r\n", "terminated;reason=noresource").status == 200
    assert notify(13, b"SIP/2.0 200 OK\r\n", "terminated").status == 481  # subscription is over
    assert a.events()[-4:] == [  # type: ignore[attr-defined]
        TransferProgressed(call=call, status=202, reason="Accepted", final=False),  # type: ignore[arg-type]
        TransferProgressed(call=call, status=100, reason="Trying", final=False),  # type: ignore[arg-type]
        TransferProgressed(call=call, status=180, reason="Ringing", final=False),  # type: ignore[arg-type]
        TransferProgressed(call=call, status=200, reason="OK", final=True),  # type: ignore[arg-type]
    ]


def test_refer_failure_sipfrag() -> None:
    net = Net()
    a, call, _ = _scripted_peer_call(net)
    a.refer(call, net.now, target_uri="sip:human@127.0.0.1:5080")  # type: ignore[attr-defined]
    refer = parse_message(a.datagrams()[0].data)  # type: ignore[attr-defined]
    assert isinstance(refer, SipRequest)
    a.receive(make_response(refer, 202).encode(), ("127.0.0.1", 5070), transport="udp", now=net.now)  # type: ignore[attr-defined]
    request = SipRequest(method="NOTIFY", uri=refer.contacts[0].uri, body=b"SIP/2.0 486 Busy Here\r\n")
    for name, value in (
        ("Via", "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKnf"),
        ("From", f"{refer.headers.get('To')}"),
        ("To", f"{refer.headers.get('From')}"),
        ("Call-ID", refer.call_id),
        ("CSeq", "20 NOTIFY"),
        ("Event", "refer"),
        ("Subscription-State", "terminated"),
        ("Content-Type", "message/sipfrag"),
    ):
        request.headers.add(name, value)
    a.receive(request.encode(), ("127.0.0.1", 5070), transport="udp", now=net.now)  # type: ignore[attr-defined]
    assert a.events()[-1] == TransferFailed(call=call, status=486, reason="Busy Here")  # type: ignore[attr-defined,arg-type]


def test_callee_sees_offer_headers() -> None:
    net, a, b = setup()
    place_call(net, a, b)
    offered = net.of_type(b, CallOffered)[0]
    names = {name for name, _ in offered.headers}  # type: ignore[attr-defined]
    assert {"Via", "From", "To", "Call-ID", "CSeq", "Contact", "Session-Expires", "Supported"} <= names


def test_the_ack_of_an_offerless_reinvite_carries_the_answer_to_our_offer() -> None:
    # A re-INVITE without an offer: our 2xx carries an offer, and the ACK the peer's answer (RFC 3261 §14.2).
    # The UAC side here ACKs without a body, so the test drops that ACK and sends one that has the answer.
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    net.drop = DropFirst("ACK", 1, source=A_ADDR)
    a.reinvite(call_a, net.now, body=b"")
    net.pump()
    assert net.of_type(b, ReinviteReceived)[-1] == ReinviteReceived(
        call=call_b, method="INVITE", body=None, content_type=None
    )
    b.answer_reinvite(call_b, net.now, body=OFFER)
    net.pump()
    ack = next(d.data for d in net.log if d.dropped and d.start_line.startswith("ACK"))
    head, _, _ = ack.partition(b"\r\n\r\n")
    head = head.replace(b"Content-Length: 0", f"Content-Length: {len(HELD)}".encode())
    with_answer = head + b"\r\nContent-Type: application/sdp\r\n\r\n" + HELD
    b.receive(with_answer, A_ADDR, transport="udp", now=net.now)
    assert [e for e in b.events() if isinstance(e, ReinviteAcked)] == [ReinviteAcked(call=call_b, body=HELD)]
    # A retransmitted ACK is absorbed: the answer is reported once.
    b.receive(with_answer, A_ADDR, transport="udp", now=net.now)
    assert [e for e in b.events() if isinstance(e, ReinviteAcked)] == []
    net.advance(40_000)  # the 2xx was ACKed: no retransmission keeps going, the call lives on
    assert net.of_type(b, CallEnded) == []
