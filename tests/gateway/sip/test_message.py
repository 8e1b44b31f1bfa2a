"""Parser/serializer: compact forms, folding, quoting, URIs, Via, Content-Length, limits."""

from __future__ import annotations

import pytest

from gateway.sip.errors import MalformedMessageError, MessageTooLargeError, RemoteProtocolError
from gateway.sip.message import SipLimits, SipRequest, SipResponse, make_response, parse_message, validate_request
from gateway.sip.uri import parse_name_addr, parse_uri


def _crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


BASIC = _crlf(
    "INVITE sip:agent@127.0.0.1:5060 SIP/2.0\n"
    "v: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKabc;rport\n"
    "Max-Forwards: 70\n"
    'f: "Alice \\"A\\" Smith" <sip:alice@example.com>;tag=1928\n'
    "t: <sip:agent@127.0.0.1>\n"
    "i: a84b4c76e66710\n"
    "CSeq: 314159 INVITE\n"
    "m: <sip:alice@127.0.0.1:5070>\n"
    "c: application/sdp\n"
    "Subject: I know you're there,\n"
    "   pick up the phone\n"
    "\t and talk to me!\n"
    "l: 4\n"
    "\n"
    "v=0\nextra"
)


def test_compact_forms_folding_quoted_display_name_and_truncation() -> None:
    message = parse_message(BASIC)
    assert isinstance(message, SipRequest)
    assert message.method == "INVITE"
    assert message.call_id == "a84b4c76e66710"
    assert message.from_.display_name == 'Alice "A" Smith'
    assert message.from_.tag == "1928"
    assert message.to.tag is None
    assert message.headers.get("Subject") == "I know you're there, pick up the phone and talk to me!"
    assert message.content_type == "application/sdp"
    assert message.body == b"v=0\r"  # Content-Length 4: the rest of the datagram is discarded
    via = message.top_via
    assert (via.transport, via.host, via.port, via.branch, via.has_rport) == (
        "UDP",
        "127.0.0.1",
        5070,
        "z9hG4bKabc",
        True,
    )
    validate_request(message)


def test_round_trip_keeps_headers_and_writes_content_length() -> None:
    message = parse_message(BASIC)
    again = parse_message(message.encode())
    assert isinstance(again, SipRequest)
    assert list(again.headers) == [*list(message.headers)[:-1], ("Content-Length", "4")]
    assert again.from_ == message.from_


def test_body_shorter_than_content_length_is_malformed_with_partial() -> None:
    data = BASIC.replace(b"l: 4", b"l: 400")
    with pytest.raises(MalformedMessageError) as info:
        parse_message(data)
    assert info.value.status_code == 400
    assert isinstance(info.value.partial, SipRequest)


def test_multi_valued_and_repeated_headers() -> None:
    data = _crlf(
        "OPTIONS sip:x@h SIP/2.0\n"
        "Via: SIP/2.0/UDP a.example.com;branch=z9hG4bK1, SIP/2.0/TCP [2001:db8::1]:5061 ; branch = z9hG4bK2\n"
        "Via: SIP / 2.0 / UDP b:5062;branch=z9hG4bK3;received=192.0.2.1\n"
        "Route: <sip:p1;lr>, <sip:p2;lr>\n"
        "Route: <sip:p3;lr>\n"
        "From: sip:a@b;tag=x\nTo: sip:x@h\nCall-ID: c\nCSeq: 1 OPTIONS\n\n"
    )
    message = parse_message(data)
    vias = message.vias
    assert [v.host for v in vias] == ["a.example.com", "[2001:db8::1]", "b"]
    assert vias[1].port == 5061 and vias[1].branch == "z9hG4bK2"
    assert vias[2].received == "192.0.2.1"
    assert message.headers.values("Route") == ["<sip:p1;lr>", "<sip:p2;lr>", "<sip:p3;lr>"]
    # addr-spec form: the parameters belong to the header, not to the URI (§20.10)
    assert message.from_.tag == "x" and message.from_.uri.params == ()


def test_uris() -> None:
    uri = parse_uri("sip:alice:secret@[::1]:5070;transport=tcp;lr?subject=hi")
    assert (uri.user, uri.password, uri.host, uri.port, uri.transport) == ("alice", "secret", "[::1]", 5070, "tcp")
    assert uri.host_port() == ("::1", 5070)
    assert str(uri) == "sip:alice:secret@[::1]:5070;transport=tcp;lr?subject=hi"
    tel = parse_uri("tel:+1-201-555-0123;phone-context=example.com")
    assert tel.scheme == "tel" and tel.user == "+1-201-555-0123" and tel.param("phone-context") == "example.com"
    assert parse_uri("SIPS:bob@example.com").host_port() == ("example.com", 5061)
    with pytest.raises(RemoteProtocolError) as info:
        parse_uri("http://example.com/")
    assert info.value.status_code == 416
    assert parse_name_addr("<mailto:a@b>").uri.scheme == "mailto"
    named = parse_name_addr("Bob Smith <sip:bob@h>;tag=9;expires=60")
    assert named.display_name == "Bob Smith" and named.tag == "9" and named.param("expires") == "60"
    assert str(parse_name_addr(str(named))) == str(named)


@pytest.mark.parametrize(
    ("start", "status"),
    [("INVITE sip:a@b SIP/7.0", 505), ("INVITE sip:a@b SIP/2.0 extra", 400), ("INVITE  SIP/2.0", 400)],
)
def test_start_line_errors(start: str, status: int) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_message(_crlf(start + "\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\n\n"))
    assert info.value.status_code == status


def test_cseq_method_mismatch_and_missing_headers() -> None:
    message = parse_message(BASIC.replace(b"CSeq: 314159 INVITE", b"CSeq: 314159 BYE"))
    assert isinstance(message, SipRequest)
    with pytest.raises(RemoteProtocolError, match="CSeq method"):
        validate_request(message)
    message = parse_message(BASIC.replace(b"i: a84b4c76e66710\r\n", b""))
    assert isinstance(message, SipRequest)
    with pytest.raises(RemoteProtocolError, match="Missing Call-ID"):
        validate_request(message)


def test_limits() -> None:
    with pytest.raises(MessageTooLargeError):
        parse_message(BASIC, limits=SipLimits(max_message_bytes=100))


def test_make_response_copies_and_tags() -> None:
    request = parse_message(BASIC)
    assert isinstance(request, SipRequest)
    response = make_response(request, 180, to_tag="xyz")
    parsed = parse_message(response.encode())
    assert isinstance(parsed, SipResponse)
    assert parsed.status == 180 and parsed.reason == "Ringing"
    assert parsed.to.tag == "xyz"
    assert parsed.headers.get("From") == request.headers.get("From")
    assert parsed.cseq == request.cseq
