"""SIP over TLS in the sans-I/O core (RFC 3261 §18, §26; RFC 5630; RFC 3263 §4.2): Via, Contact, sips dialogs,
target selection with the preferred connection of a dialog, and transport errors failing client transactions.

The in-memory network delivers each message to the endpoint bound at its destination, so a "connection" here is
the pair of bound addresses; the flows of a real TLS peer (an ephemeral source port) are built by hand.
"""

from __future__ import annotations

import pytest

from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import (
    CallEnded,
    CallEstablished,
    CallOffered,
    OptionsAnswered,
    OutboundCallAnswered,
    OutboundCallFailed,
    Outgoing,
    ReinviteFailed,
)
from gateway.sip.message import SipRequest, SipResponse, parse_message
from gateway.sip.uri import parse_uri
from tests.gateway.sip.sipnet import Net

OFFER = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
PEER = ("127.0.0.1", 43366)  # a TLS phone's ephemeral source port; it listens on 35061


def _tls_net() -> tuple[Net, SipEndpoint, SipEndpoint]:
    net = Net()
    a = net.add(5071, tls_port=5071, transports=("udp", "tcp", "tls"))
    b = net.add(5072, tls_port=5072, transports=("udp", "tcp", "tls"))
    return net, a, b


def _request(data: bytes) -> SipRequest:
    message = parse_message(data)
    assert isinstance(message, SipRequest)
    return message


def _response(data: bytes) -> SipResponse:
    message = parse_message(data)
    assert isinstance(message, SipResponse)
    return message


def _inbound_invite(uri: str, *, contact: str = "<sip:phone@127.0.0.1:35061;transport=tls>") -> bytes:
    return (
        f"INVITE {uri} SIP/2.0\r\n"
        "Via: SIP/2.0/TLS 127.0.0.1:35061;branch=z9hG4bKtls1;rport\r\n"
        "Max-Forwards: 70\r\nFrom: <sip:phone@127.0.0.1>;tag=p1\r\nTo: <sip:agent@127.0.0.1>\r\n"
        f"Call-ID: tls-1\r\nCSeq: 1 INVITE\r\nContact: {contact}\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(OFFER)}\r\n\r\n"
    ).encode() + OFFER


def test_uris_name_tls_and_default_to_port_5061() -> None:
    assert parse_uri("sips:bob@example.com").transport == "tls"
    assert parse_uri("sips:bob@example.com;transport=tcp").transport == "tls"  # RFC 5630 §3.2: TLS over TCP
    assert parse_uri("sip:bob@example.com;transport=TLS").host_port() == ("example.com", 5061)
    assert parse_uri("sip:bob@example.com;transport=tcp").host_port() == ("example.com", 5060)
    assert not parse_uri("sip:bob@example.com").names_transport


def test_an_invite_to_a_transport_tls_uri_goes_over_tls_with_our_tls_port() -> None:
    net, a, _ = _tls_net()
    a.invite("sip:agent@127.0.0.1;transport=tls", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    [out] = a.datagrams()
    assert (out.destination, out.transport, out.flow) == (("127.0.0.1", 5061), "tls", None)
    invite = _request(out.data)
    assert (invite.headers.get("Via") or "").startswith("SIP/2.0/TLS 127.0.0.1:5071;branch=z9hG4bK")
    assert invite.headers.get("Contact") == "<sip:gateway@127.0.0.1:5071;transport=tls>"


def test_a_sips_target_makes_a_secure_dialog_with_a_sips_contact() -> None:
    net, a, b = _tls_net()
    call = a.invite("sips:agent@127.0.0.1:5072", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    assert a.transport_of(call) == "tls"
    net.pump()
    [offered] = net.of_type(b, CallOffered)
    assert isinstance(offered, CallOffered) and offered.transport == "tls"
    b.answer(offered.call, net.now, body=OFFER)
    net.pump()
    assert net.of_type(a, OutboundCallAnswered) and net.of_type(b, CallEstablished)
    ok = next(d for d in net.log if d.start_line == "SIP/2.0 200 OK" and b"INVITE" in d.data.split(b"CSeq:")[1][:12])
    assert _response(ok.data).headers.get("Contact") == "<sips:gateway@127.0.0.1:5072>"
    a.hang_up(call, net.now)
    net.pump()
    bye = next(d for d in net.log if d.start_line.startswith("BYE "))
    assert bye.start_line == "BYE sips:gateway@127.0.0.1:5072 SIP/2.0"
    assert (_request(bye.data).headers.get("Via") or "").startswith("SIP/2.0/TLS 127.0.0.1:5071;")
    assert net.of_type(b, CallEnded)


def test_a_sips_target_without_tls_is_refused_not_downgraded() -> None:
    net = Net()
    a = net.add(5071)
    with pytest.raises(LocalProtocolError, match="TLS"):
        a.invite("sips:agent@127.0.0.1", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    with pytest.raises(LocalProtocolError, match="TLS"):
        a.send_options("sip:agent@127.0.0.1;transport=tls", net.now)
    assert a.datagrams() == []


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_a_sips_request_uri_over_a_plain_transport_gets_416(transport: str) -> None:
    net, _, b = _tls_net()
    b.receive(_inbound_invite("sips:agent@127.0.0.1"), PEER, transport=transport, now=net.now)
    [out] = b.datagrams()
    assert out.data.startswith(b"SIP/2.0 416 ")
    assert b.events() == []


def test_responses_go_back_on_the_tls_connection_and_in_dialog_requests_prefer_it() -> None:
    net, _, b = _tls_net()
    b.receive(_inbound_invite("sips:agent@127.0.0.1:5072"), PEER, transport="tls", now=net.now)
    [trying] = b.datagrams()
    assert (trying.destination, trying.transport) == (PEER, "tls")  # the connection, not Via's 35061
    [offered] = [e for e in b.events() if isinstance(e, CallOffered)]
    b.answer(offered.call, net.now, body=OFFER)
    [ok] = b.datagrams()
    assert (ok.destination, ok.transport) == (PEER, "tls")
    assert _response(ok.data).headers.get("Contact") == "<sips:gateway@127.0.0.1:5072>"
    ack = (
        "ACK sips:gateway@127.0.0.1:5072 SIP/2.0\r\nVia: SIP/2.0/TLS 127.0.0.1:35061;branch=z9hG4bKtls2;rport\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:phone@127.0.0.1>;tag=p1\r\nTo: {_response(ok.data).headers.get('To')}\r\n"
        "Call-ID: tls-1\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    b.receive(ack, PEER, transport="tls", now=net.now)
    assert b.flow_in_use("tls", PEER) and not b.flow_in_use("tcp", PEER)  # the glue keeps it open meanwhile
    b.hang_up(offered.call, net.now)
    [bye] = b.datagrams()
    # RFC 3261 sends it to the Contact (35061); the connection the phone opened from 43366 is preferred.
    assert (bye.destination, bye.transport, bye.flow) == (("127.0.0.1", 35061), "tls", PEER)
    assert (_request(bye.data).headers.get("Via") or "").startswith("SIP/2.0/TLS 127.0.0.1:5072;")


def test_an_in_dialog_request_to_another_host_names_no_flow() -> None:
    net, _, b = _tls_net()
    invite = _inbound_invite("sip:agent@127.0.0.1:5072", contact="<sip:phone@192.0.2.10:5061;transport=tls>")
    b.receive(invite, PEER, transport="tls", now=net.now)
    [offered] = [e for e in b.events() if isinstance(e, CallOffered)]
    b.answer(offered.call, net.now, body=OFFER)
    ok = _response(b.datagrams()[-1].data)
    assert ok.headers.get("Contact") == "<sip:gateway@127.0.0.1:5072;transport=tls>"  # not sips: a sip R-URI
    ack = (
        "ACK sip:gateway@127.0.0.1:5072 SIP/2.0\r\nVia: SIP/2.0/TLS 127.0.0.1:35061;branch=z9hG4bKtls3;rport\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:phone@127.0.0.1>;tag=p1\r\nTo: {ok.headers.get('To')}\r\n"
        "Call-ID: tls-1\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    b.receive(ack, PEER, transport="tls", now=net.now)
    b.hang_up(offered.call, net.now)
    [bye] = b.datagrams()
    assert (bye.destination, bye.transport, bye.flow) == (("192.0.2.10", 5061), "tls", None)


def _bye_through_record_route(b: SipEndpoint, record_route: str) -> Outgoing:
    """An inbound call over UDP through a proxy that record-routes, answered, ACKed, then hung up by us."""
    invite = _inbound_invite("sip:agent@127.0.0.1:5072").replace(
        b"Contact:", f"Record-Route: {record_route}\r\nContact:".encode()
    )
    b.receive(invite, ("127.0.0.1", 40000), transport="udp", now=0.0)
    [offered] = [e for e in b.events() if isinstance(e, CallOffered)]
    b.answer(offered.call, 0.0, body=OFFER)
    ok = _response(b.datagrams()[-1].data)
    ack = (
        "ACK sip:gateway@127.0.0.1:5072 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:40000;branch=z9hG4bKtls4;rport\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:phone@127.0.0.1>;tag=p1\r\nTo: {ok.headers.get('To')}\r\n"
        "Call-ID: tls-1\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    b.receive(ack, ("127.0.0.1", 40000), transport="udp", now=0.0)
    b.hang_up(offered.call, 0.0)
    [bye] = b.datagrams()
    return bye


def test_a_record_route_naming_tls_takes_in_dialog_requests_over_tls() -> None:
    _, _, b = _tls_net()
    bye = _bye_through_record_route(b, "<sip:10.0.0.9:5061;transport=tls;lr>")
    assert (bye.destination, bye.transport) == (("10.0.0.9", 5061), "tls")
    request = _request(bye.data)
    # Loose routing (;lr is a flag without a value): the remote target stays the Request-URI.
    assert bye.data.startswith(b"BYE sip:phone@127.0.0.1:35061;transport=tls SIP/2.0\r\n")
    assert request.headers.get("Route") == "<sip:10.0.0.9:5061;transport=tls;lr>"
    assert (request.headers.get("Via") or "").startswith("SIP/2.0/TLS 127.0.0.1:5072;")


def test_a_failed_connection_ends_an_outbound_call_at_once_with_503_and_the_cause() -> None:
    net, a, _ = _tls_net()
    call = a.invite("sip:agent@127.0.0.1:5999;transport=tls", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    [out] = a.datagrams()
    detail = "TLS handshake with 127.0.0.1:5999 failed: certificate verify failed: self-signed certificate"
    a.transport_failed(out, net.now, cause="tls", detail=detail)
    events = a.events()
    assert events == [
        OutboundCallFailed(call=call, status=503, reason=detail, transport_error="tls"),
        CallEnded(call=call, reason=detail, by="remote", status=503),
    ]
    assert a.next_deadline() is None  # no Timer A/B left: nothing hangs for 32 s
    assert a.datagrams() == [] and a.call_count == 0


def test_a_transport_error_answers_other_requests_as_503() -> None:
    net, a, b = _tls_net()
    request_id = a.send_options("sip:agent@127.0.0.1:5999;transport=tls", net.now)
    [out] = a.datagrams()
    a.transport_failed(out, net.now, cause="connect", detail="connection refused")
    assert a.events() == [OptionsAnswered(request_id=request_id, status=503)]
    # A re-INVITE whose connection cannot be made again fails as a 503; the call goes on.
    call = a.invite("sip:agent@127.0.0.1:5072;transport=tls", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    net.pump()
    [offered] = net.of_type(b, CallOffered)
    assert isinstance(offered, CallOffered)
    b.answer(offered.call, net.now, body=OFFER)
    net.pump()
    a.reinvite(call, net.now, body=OFFER)
    [reinvite] = a.datagrams()
    assert reinvite.flow == ("127.0.0.1", 5072) and reinvite.transport == "tls"
    a.transport_failed(reinvite, net.now, cause="connect", detail="connection refused")
    failed = [e for e in a.events() if isinstance(e, ReinviteFailed)]
    assert failed == [ReinviteFailed(call=call, method="INVITE", status=503, reason="connection refused")]
    assert a.call_count == 1


def test_a_transport_error_for_another_destination_touches_nothing() -> None:
    net, a, _ = _tls_net()
    a.invite("sip:agent@127.0.0.1:5999;transport=tls", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    a.datagrams()
    other = Outgoing(data=b"", destination=("127.0.0.1", 5998), transport="tls")
    a.transport_failed(other, net.now, cause="tls", detail="x")
    a.transport_failed(
        Outgoing(data=b"", destination=("127.0.0.1", 5999), transport="tcp"), net.now, cause="x", detail="x"
    )
    assert a.events() == [] and a.call_count == 1


def test_a_strict_route_becomes_the_request_uri_and_its_transport_still_chooses() -> None:
    _, _, b = _tls_net()
    bye = _bye_through_record_route(b, "<sip:10.0.0.9:5061;transport=tls>")
    assert bye.data.startswith(b"BYE sip:10.0.0.9:5061 SIP/2.0\r\n")  # §12.2.1.1, transport param removed
    assert (bye.destination, bye.transport) == (("10.0.0.9", 5061), "tls")
    assert _request(bye.data).headers.get("Route") == "<sip:phone@127.0.0.1:35061;transport=tls>"


def test_transaction_table_transport_errors() -> None:
    from gateway.sip.timers import SipTimers
    from gateway.sip.transaction import Transaction, TransportErrorReported, TxKind, TxState

    invite = _request(_inbound_invite("sip:agent@127.0.0.1"))
    for kind in (TxKind.INVITE_CLIENT, TxKind.NON_INVITE_CLIENT):
        tx, _ = Transaction.start(kind, invite, peer=PEER, transport="tls", timers=SipTimers(), now=0.0)
        assert tx.transport_error(0.0, cause="tls", detail="handshake failed") == [
            TransportErrorReported(cause="tls", detail="handshake failed")
        ]
        assert tx.state is TxState.TERMINATED and tx.next_deadline() is None
    server, _ = Transaction.start(TxKind.INVITE_SERVER, invite, peer=PEER, transport="tls", timers=SipTimers(), now=0)
    assert server.transport_error(0.0, cause="tls", detail="x") == [] and server.state is TxState.PROCEEDING
