"""RFC 4475-style torture messages fed to one endpoint, each answered with the right status (or dropped),
the TCP framer fed one byte at a time, policy (allow-list, rate limit, digest) and a hypothesis property:
arbitrary bytes never make `receive` raise and the endpoint keeps working."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.sip.auth import DigestAuthenticator, DigestClientCredentials
from gateway.sip.config import RateLimit, SipConfig
from gateway.sip.digest import DigestChallenger
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import MessageTooLargeError, UnframeableStreamError
from gateway.sip.events import CallOffered, OutboundCallAnswered, OutboundCallFailed
from gateway.sip.framing import StreamFramer
from gateway.sip.message import SipRequest, SipResponse, parse_message
from tests.gateway.sip.sipnet import FakeAuthenticator, FakeCredentials, Net
from tests.gateway.sip.test_calls import OFFER, place_call, setup

PEER = ("127.0.0.1", 5070)


def endpoint(**config: object) -> SipEndpoint:
    return SipEndpoint(SipConfig(local_port=5062, **config), rng=random.Random(7))  # type: ignore[arg-type]


def request(
    method: str = "OPTIONS",
    uri: str = "sip:agent@127.0.0.1:5062",
    *,
    version: str = "SIP/2.0",
    extra: str = "",
    omit: str = "",
    cseq_method: str | None = None,
    body: str = "",
    branch: str = "z9hG4bKt1",
) -> bytes:
    lines = [
        f"{method} {uri} {version}",
        f"Via: SIP/2.0/UDP 127.0.0.1:5070;branch={branch};rport",
        "Max-Forwards: 70",
        "From: <sip:tester@127.0.0.1:5070>;tag=t1",
        "To: <sip:agent@127.0.0.1:5062>",
        "Call-ID: torture-1@127.0.0.1",
        f"CSeq: 1 {cseq_method or method}",
        "Contact: <sip:tester@127.0.0.1:5070>",
    ]
    lines = [line for line in lines if not (omit and line.startswith(omit + ":"))]
    text = "\r\n".join(lines) + "\r\n" + extra + f"Content-Length: {len(body)}\r\n\r\n" + body
    return text.encode()


def answer_of(ep: SipEndpoint, data: bytes, *, destination: tuple[str, int] = PEER) -> SipResponse | None:
    ep.receive(data, PEER, transport="udp", now=0.0)
    out = ep.datagrams()
    if not out:
        return None
    response = parse_message(out[-1].data)
    assert isinstance(response, SipResponse)
    assert out[-1].destination == destination
    return response


WSINV = (
    "INVITE sip:agent@127.0.0.1:5062 SIP/2.0\r\n"
    "TO :\r\n sip:agent@127.0.0.1:5062 ;   tag    = 1918181833n\r\n"  # folded, odd spacing: an in-dialog tag
    'from   : "J Rosenberg \\\\\\""       <sip:jdrosen@127.0.0.1>\r\n  ;\r\n  tag = 98asjd8\r\n'
    "MaX-fOrWaRdS: 0068\r\n"
    "Call-ID\r\n\t:\r\n  0ha0isndaksdj@192.0.2.1\r\n"
    "cseq: 0009\r\n  INVITE\r\n"
    "Via  : SIP  /   2.0\r\n  /UDP\r\n    192.0.2.2;branch=390skdjuw\r\n"
    "s :\r\n"
    "NewFangledHeader:   newfangled value\r\n continued newfangled value\r\n"
    "UnknownHeaderWithUnusualValue: ;;,,;;,;\r\n"
    "Content-Type: application/sdp\r\n"
    'm:"Quoted string\\"\\"" <sip:jdrosen@127.0.0.1:5070> ; newparam =\r\n      newvalue ;\r\n'
    "  secondparam ; q = 0.33\r\n"
    "l: 0\r\n\r\n"
)


def test_wsinv_style_whitespace_folding_and_escapes_parse() -> None:
    message = parse_message(WSINV.encode())
    assert message.to.tag == "1918181833n"
    assert message.from_.display_name == 'J Rosenberg \\"' and message.from_.tag == "98asjd8"
    assert message.call_id == "0ha0isndaksdj@192.0.2.1"
    assert message.cseq.number == 9 and message.cseq.method == "INVITE"
    assert message.top_via.host == "192.0.2.2" and message.top_via.branch == "390skdjuw"
    assert message.contacts[0].display_name == 'Quoted string""' and message.contacts[0].param("q") == "0.33"
    assert message.headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    ep = endpoint()
    # no rport asked: the answer goes to the source address (received=) at the sent-by port (§18.2.2)
    response = answer_of(ep, WSINV.encode(), destination=("127.0.0.1", 5060))
    assert response is not None and response.status == 481  # in-dialog (To tag) for an unknown dialog
    assert response.top_via.received == PEER[0]  # the sent-by 192.0.2.2 is not where it came from


def test_compact_forms_out_of_dialog_invite_is_offered() -> None:
    data = (
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0\r\n"
        "v: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKc1\r\n"
        "f: <sip:a@127.0.0.1>;tag=x\r\nt: sip:agent@127.0.0.1:5062\r\ni: compact@h\r\n"
        "CSeq: 5 INVITE\r\nm: <sip:a@127.0.0.1:5070>\r\nc: application/sdp\r\nk: timer\r\n"
        f"l: {len(OFFER)}\r\n\r\n"
    ).encode() + OFFER
    ep = endpoint()
    response = answer_of(ep, data)
    assert response is not None and response.status == 100
    offered = ep.events()
    assert len(offered) == 1 and isinstance(offered[0], CallOffered) and offered[0].body == OFFER


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (request(), 200),
        (request(version="SIP/7.0"), 505),
        (request(extra="Require: nonsense, timer\r\n"), 420),
        (request(uri="sips:agent@127.0.0.1:5062"), 416),
        (request(uri="http://example.com/agent"), 416),
        (request(uri="tel:+15551234567"), 200),
        (request(method="NEWMETHOD"), 501),
        (request(method="REGISTER"), 405),
        (request(method="MESSAGE"), 405),
        (request(cseq_method="INVITE"), 400),
        (request(omit="Call-ID"), 400),
        (request(omit="From"), 400),
        (request(omit="CSeq"), 400),
        (request(omit="Via"), None),
        (request(omit="Max-Forwards", extra="Max-Forwards: 0\r\n", method="INFO"), 483),
        (request(omit="Max-Forwards", extra="Max-Forwards: 0\r\n"), 200),  # OPTIONS is answered anyway
        (request(extra="CSeq: 1 OPTIONS\r\n", omit="CSeq") + b"", 200),
        (request().replace(b"Content-Length: 0", b"Content-Length: 40"), 400),
        (request(extra="Content-Length: 3\r\n", body="hello"), 400),  # RFC 4475 mcl01: two lengths
        (request(extra="l: 3\r\n", body="hello"), 400),  # the same through the compact form
        (request(extra="Content-Length: 5\r\n", body="hello").replace(b"Length: 5", b"Length:  5 "), 200),
        (request().replace(b"CSeq: 1 OPTIONS", b"CSeq: 99999999999 OPTIONS"), 400),
        (request().replace(b"Via: SIP/2.0/UDP", b"Via: SIP/2.0/UDP ;;"), None),
        (request(method="BYE"), 481),
        (request(method="INVITE", extra="Session-Expires: 30\r\n"), 422),
        (request(method="INVITE", omit="Contact"), 400),
        (request(extra="Bad Header Line\r\n"), 400),
        (request().replace(b"To: <sip:agent@127.0.0.1:5062>", b"To: <sip:agent@127.0.0.1:5062"), 400),
    ],
)
def test_torture_statuses(data: bytes, status: int | None) -> None:
    ep = endpoint()
    response = answer_of(ep, data)
    if status is None:
        assert response is None
        assert ep.stats.malformed_dropped == 1
    else:
        assert response is not None and response.status == status, response and response.reason
    assert ep.stats.internal_errors == 0


def test_error_answers_carry_what_the_peer_needs() -> None:
    ep = endpoint()
    unsupported = answer_of(ep, request(extra="Require: nonsense, timer\r\n"))
    assert unsupported is not None and unsupported.headers.get("Unsupported") == "nonsense"
    not_allowed = answer_of(ep, request(method="REGISTER"))
    assert not_allowed is not None and "INVITE" in (not_allowed.headers.get("Allow") or "")
    too_small = answer_of(ep, request(method="INVITE", extra="Session-Expires: 30\r\n"))
    assert too_small is not None and too_small.headers.get("Min-SE") == "90"
    assert too_small.to.tag  # every error response carries a To tag


def test_merged_request_gets_482() -> None:
    ep = endpoint()
    first = answer_of(ep, request(method="INVITE"))
    assert first is not None and first.status == 100
    again = answer_of(ep, request(method="INVITE"))  # a retransmission: absorbed with 100 again
    assert again is not None and again.status == 100
    merged = answer_of(ep, request(method="INVITE", branch="z9hG4bKother"))
    assert merged is not None and merged.status == 482


def test_response_goes_to_received_and_rport() -> None:
    ep = endpoint()
    data = request().replace(b"127.0.0.1:5070;branch=z9hG4bKt1;rport", b"192.0.2.9:5999;branch=z9hG4bKt1")
    ep.receive(data, ("198.51.100.4", 40000), transport="udp", now=0.0)
    (out,) = ep.datagrams()
    assert out.destination == ("198.51.100.4", 5999)  # received= host, sent-by port (no rport asked)
    ep.receive(request(), ("198.51.100.4", 40001), transport="udp", now=0.0)
    (out,) = ep.datagrams()
    assert out.destination == ("198.51.100.4", 40001)
    ep.receive(request(branch="z9hG4bKtcp"), ("198.51.100.4", 40002), transport="tcp", now=0.0)
    (out,) = ep.datagrams()
    assert out.destination == ("198.51.100.4", 40002) and out.transport == "tcp"


def test_a_forged_received_does_not_steer_the_answer() -> None:
    ep = endpoint()
    forged = request().replace(
        b"127.0.0.1:5070;branch=z9hG4bKt1;rport", b"198.51.100.4:5070;branch=z9hG4bKt1;received=192.0.2.66"
    )
    ep.receive(forged, ("198.51.100.4", 5070), transport="udp", now=0.0)
    (out,) = ep.datagrams()
    assert out.destination == ("198.51.100.4", 5070)  # the real source, not the address in the message


def test_stream_framer_one_byte_at_a_time() -> None:
    stream = b"\r\n\r\n" + request() + b"\r\n" + request(method="INVITE", body="v=0\r\n") + b"\r\n\r\n" + request()
    framer = StreamFramer()
    messages: list[bytes] = []
    for index in range(len(stream)):
        messages.extend(framer.feed(stream[index : index + 1]))
    assert [parse_message(m, framed=True).headers.get("CSeq") for m in messages] == [
        "1 OPTIONS",
        "1 INVITE",
        "1 OPTIONS",
    ]
    assert parse_message(messages[1], framed=True).body == b"v=0\r\n"
    assert framer.buffered == 0 and framer.keepalives == 5


def test_stream_framer_whole_and_split_agree() -> None:
    stream = request() * 3
    assert StreamFramer().feed(stream) == [request()] * 3


def test_allow_list_rejects_with_403() -> None:
    ep = endpoint(allow_cidrs=("10.0.0.0/8",))
    response = answer_of(ep, request())
    assert response is not None and response.status == 403
    ep.receive(request(), ("10.1.2.3", 5060), transport="udp", now=0.0)
    (out,) = ep.datagrams()
    assert parse_message(out.data).status == 200  # type: ignore[union-attr]
    assert ep.stats.policy_rejected == 1


def test_rate_limit_drops_a_flood_and_recovers() -> None:
    ep = endpoint(rate_limit=RateLimit(per_second=2.0, burst=3))
    statuses = []
    for index in range(6):
        data = request(branch=f"z9hG4bKr{index}").replace(b"torture-1", f"flood-{index}".encode())
        ep.receive(data, PEER, transport="udp", now=0.0)
        statuses.append([parse_message(o.data).status for o in ep.datagrams()])  # type: ignore[union-attr]
    assert statuses == [[200], [200], [200], [], [], []]
    assert ep.stats.policy_dropped == 3
    ep.receive(request(branch="z9hG4bKlater"), PEER, transport="udp", now=0.5)  # one token back after 0.5 s
    assert len(ep.datagrams()) == 1
    ep.receive(request(branch="z9hG4bKother"), ("127.0.0.9", 5070), transport="udp", now=0.5)
    assert len(ep.datagrams()) == 1  # buckets are per source


def test_digest_challenge_round_trip() -> None:
    authenticator = FakeAuthenticator(realm="gw", username="trunk", password="s3cret")
    net, a, b = setup(authenticator=authenticator)
    call = a.invite(
        "sip:agent@127.0.0.1:5062",
        net.now,
        from_uri="<sip:alice@127.0.0.1:5061>",
        body=OFFER,
        credentials=FakeCredentials(username="trunk", password="s3cret"),
    )
    net.pump()
    assert net.lines()[:4] == [
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 401 Unauthorized",
        "ACK sip:agent@127.0.0.1:5062 SIP/2.0",
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
    ]
    offered = net.of_type(b, CallOffered)
    assert len(offered) == 1
    b.answer(offered[0].call, net.now, body=OFFER)  # type: ignore[attr-defined]
    net.pump()
    assert len(net.of_type(a, OutboundCallAnswered)) == 1
    retry = parse_message(net.log[3].data)
    assert retry.cseq.number == 2 and "Authorization" in retry.headers
    assert b.stats.auth_challenged == 1
    # In-dialog requests are not challenged: hang up works.
    a.hang_up(call, net.now)
    net.pump()
    assert net.lines()[-1] == "SIP/2.0 200 OK"


def test_digest_wrong_password_fails_once_without_looping() -> None:
    net, a, b = setup(authenticator=FakeAuthenticator(realm="gw", username="trunk", password="s3cret"))
    call = a.invite(
        "sip:agent@127.0.0.1:5062",
        net.now,
        from_uri="<sip:alice@127.0.0.1:5061>",
        body=OFFER,
        credentials=FakeCredentials(username="trunk", password="wrong"),
    )
    net.pump()
    assert net.of_type(a, OutboundCallFailed) == [OutboundCallFailed(call=call, status=401, reason="Unauthorized")]
    assert net.lines().count("SIP/2.0 401 Unauthorized") == 2
    assert net.of_type(b, CallOffered) == []


_TEMPLATES = [request(), request(method="INVITE", body="v=0\r\n"), WSINV.encode(), request(method="BYE")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=600),
        st.tuples(st.sampled_from(_TEMPLATES), st.integers(0, 700), st.binary(max_size=8)).map(
            lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + len(t[2]) :]
        ),
        st.tuples(st.sampled_from(_TEMPLATES), st.integers(0, 700)).map(lambda t: t[0][: t[1]]),
    ),
    st.sampled_from(["udp", "tcp"]),
)
def test_receive_never_raises_and_the_endpoint_keeps_working(data: bytes, transport: str) -> None:
    ep = endpoint()
    ep.receive(data, PEER, transport=transport, now=0.0)
    ep.handle_timers(100.0)
    ep.datagrams()
    ep.events()
    assert ep.stats.internal_errors == 0
    response = answer_of(ep, request(branch="z9hG4bKafter").replace(b"torture-1", b"after-fuzz"))
    assert response is not None and response.status == 200


def test_call_survives_garbage_in_the_middle() -> None:
    net: Net
    net, a, b = setup()
    call_a, _call_b = place_call(net, a, b)
    for junk in (b"", b"\r\n\r\n", b"SIP/2.0 200 OK\r\n\r\n", b"\x00\xff" * 40, WSINV.encode()):
        b.receive(junk, ("127.0.0.1", 5061), transport="udp", now=net.now)
    assert b.stats.internal_errors == 0
    a.send_dtmf_info(call_a, net.now, digit="1")
    net.pump()
    assert net.lines()[-1] == "SIP/2.0 200 OK"


def test_digest_round_trip_with_digest_module_adapters() -> None:
    challenger = DigestChallenger(
        realm="gw.example", credentials={"trunk": "s3cret"}.get, nonce_secret=b"0123456789abcdef0123"
    )
    authenticator = DigestAuthenticator(challenger, rng=random.Random(1))
    net, a, b = setup(authenticator=authenticator)
    good = DigestClientCredentials(username="trunk", password="s3cret", rng=random.Random(2))
    call = a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER, credentials=good)
    net.pump()
    assert net.lines()[1] == "SIP/2.0 401 Unauthorized"
    challenge = parse_message(net.log[1].data).headers.get("WWW-Authenticate") or ""
    assert 'realm="gw.example"' in challenge and "qop" in challenge
    assert len(net.of_type(b, CallOffered)) == 1
    bad = DigestClientCredentials(username="trunk", password="nope", rng=random.Random(3))
    failed = a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER, credentials=bad)
    net.pump()
    assert net.of_type(a, OutboundCallFailed) == [OutboundCallFailed(call=failed, status=401, reason="Unauthorized")]
    assert len(net.of_type(b, CallOffered)) == 1
    assert call != failed


@pytest.mark.parametrize(
    ("extra", "status"),
    [("Content-Length: \u00b2", 400), ("X-Note: x", None)],
)
def test_unicode_digits_are_not_numbers(extra: str, status: int | None) -> None:
    ep = endpoint()
    ep.receive(request(extra=extra), ("198.51.100.4", 5070), transport="udp", now=0.0)
    (out,) = ep.datagrams()
    answer = parse_message(out.data)
    assert isinstance(answer, SipResponse)
    assert answer.status == (status or 200)
    assert ep.stats.internal_errors == 0


def test_an_unbounded_content_length_on_a_stream_closes_it() -> None:
    framer = StreamFramer()
    with pytest.raises(MessageTooLargeError):
        framer.feed(b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")


MCL01 = (
    b"OPTIONS sip:user@example.com SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP host5.example.net;branch=z9hG4bK293423\r\n"
    b"To: sip:user@example.com\r\n"
    b"From: sip:other@example.net;tag=3923942\r\n"
    b"Call-ID: mcl01.fhn2323orihawfdoa3o4r52o3irsdf\r\n"
    b"CSeq: 15932 OPTIONS\r\n"
    b"Content-Length: 13\r\n"
    b"Max-Forwards: 60\r\n"
    b"Content-Length: 5\r\n"
    b"Content-Type: text/plain\r\n"
    b"\r\n"
    b"There's no way to know how many octets are supposed to be here.\r\n"
)

# RFC 4475 §3.4.1: an RFC 2543 INVITE. No branch cookie, no From tag, no Max-Forwards, no Contact, no
# Content-Type and no Content-Length (over UDP the body runs to the end of the datagram).
INV2543 = (
    b"INVITE sip:UserB@example.com SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 192.0.2.15\r\n"
    b"From: <sip:UserA@example.com>\r\n"
    b"To: <sip:UserB@example.com>\r\n"
    b"Call-ID: 31415@c.example.com\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"\r\n"
    b"v=0\r\n"
    b"o=UserA 2890844526 2890844526 IN IP4 example.com\r\n"
    b"s=-\r\n"
    b"c=IN IP4 192.0.2.5\r\n"
    b"t=0 0\r\n"
    b"m=audio 49217 RTP/AVP 0\r\n"
)
PEER_2543 = ("192.0.2.15", 5060)


@pytest.mark.parametrize(
    ("head", "why"),
    [(MCL01, "two different Content-Length"), (b"OPTIONS sip:a@b SIP/2.0\r\nl: twelve\r\n\r\n", "not a number")],
)
def test_a_stream_whose_message_end_cannot_be_known_is_unframeable(head: bytes, why: str) -> None:
    framer = StreamFramer()
    with pytest.raises(UnframeableStreamError, match=why):
        for index in range(len(head)):  # however it is chunked
            framer.feed(head[index : index + 1])
    # The same length written twice frames as one message.
    same = b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 2\r\ncontent-length:2 \r\n\r\nhi"
    assert StreamFramer().feed(same) == [same]


def test_rfc4475_mcl01_two_content_lengths_get_400() -> None:
    ep = endpoint()
    ep.receive(MCL01, PEER_2543, transport="udp", now=0.0)
    (out,) = ep.datagrams()
    response = parse_message(out.data)
    assert isinstance(response, SipResponse)
    assert (response.status, response.reason) == (400, "conflicting Content-Length values")
    assert response.call_id == "mcl01.fhn2323orihawfdoa3o4r52o3irsdf"
    assert ep.events() == []


def test_rfc4475_inv2543_is_accepted_and_its_dialog_targets_the_from_uri() -> None:
    ep = endpoint()
    ep.receive(INV2543, PEER_2543, transport="udp", now=0.0)
    assert [parse_message(d.data).status for d in ep.datagrams()] == [100]  # type: ignore[union-attr]
    (offered,) = ep.events()
    assert isinstance(offered, CallOffered)
    assert offered.body.endswith(b"m=audio 49217 RTP/AVP 0\r\n") and offered.from_uri == "sip:UserA@example.com"
    ep.answer(offered.call, 0.1, body=OFFER)
    (ok_out,) = ep.datagrams()
    ok = parse_message(ok_out.data)
    assert isinstance(ok, SipResponse) and ok.status == 200 and ok_out.destination == PEER_2543
    assert ok.headers.get("Via") == "SIP/2.0/UDP 192.0.2.15" and ok.to.tag
    # The RFC 2543 peer's ACK (again no branch cookie) is matched by the dialog and confirms the call.
    ack = (
        "ACK sip:gateway@127.0.0.1:5062 SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 192.0.2.15\r\n"
        "From: <sip:UserA@example.com>\r\n"
        f"To: <sip:UserB@example.com>;tag={ok.to.tag}\r\n"
        "Call-ID: 31415@c.example.com\r\n"
        "CSeq: 1 ACK\r\n\r\n"
    ).encode()
    ep.receive(ack, PEER_2543, transport="udp", now=0.2)
    assert [type(e).__name__ for e in ep.events()] == ["CallEstablished"]
    # Without a Contact, in-dialog requests go where RFC 2543 sent them: the From URI (port 5060 by default).
    ep.hang_up(offered.call, 0.3)
    (bye_out,) = ep.datagrams()
    bye = parse_message(bye_out.data)
    assert isinstance(bye, SipRequest) and bye.method == "BYE" and str(bye.uri) == "sip:UserA@example.com"
    assert bye_out.destination == ("example.com", 5060) and bye.to.tag is None
    assert ep.stats.internal_errors == 0
