"""Two SipEndpoints talking in memory under a fake clock: call set-up, tear-down, loss, CANCEL races."""

from __future__ import annotations

import pytest

from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import LocalProtocolError, SipConfigError
from gateway.sip.events import (
    CallCancelled,
    CallEnded,
    CallEstablished,
    CallHandle,
    CallOffered,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgressed,
)
from gateway.sip.message import SipRequest, parse_message
from tests.gateway.sip.sipnet import DropFirst, Net

OFFER = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
ANSWER = OFFER.replace(b"4000", b"5000")
A_ADDR, B_ADDR = ("127.0.0.1", 5061), ("127.0.0.1", 5062)


def setup(net: Net | None = None, **b_config: object) -> tuple[Net, SipEndpoint, SipEndpoint]:
    net = net or Net()
    a = net.add(5061)
    b = net.add(5062, **b_config)
    return net, a, b


def place_call(net: Net, a: SipEndpoint, b: SipEndpoint, *, answer: bool = True) -> tuple[CallHandle, CallHandle]:
    before = len(net.of_type(b, CallOffered))
    call_a = a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=OFFER)
    offered = net.of_type(b, CallOffered)
    assert len(offered) == before + 1
    call_b = offered[-1].call
    b.ring(call_b, net.now)
    net.pump()
    if answer:
        b.answer(call_b, net.now, body=ANSWER)
        net.pump()
    return call_a, call_b


def test_invite_100_180_200_ack_then_bye_from_caller() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    offered = net.of_type(b, CallOffered)[0]
    assert offered.body == OFFER and offered.content_type == "application/sdp"
    assert offered.from_uri == "sip:alice@127.0.0.1:5061" and offered.request_uri == "sip:agent@127.0.0.1:5062"
    assert net.lines() == [
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 100 Trying",
        "SIP/2.0 180 Ringing",
        "SIP/2.0 200 OK",
        "ACK sip:gateway@127.0.0.1:5062 SIP/2.0",
    ]
    assert [type(e) for e in net.events(a)] == [OutboundCallProgressed, OutboundCallAnswered]
    assert net.of_type(a, OutboundCallAnswered)[0].body == ANSWER  # type: ignore[attr-defined]
    assert net.of_type(b, CallEstablished) == [CallEstablished(call=call_b, body=b"")]
    a.hang_up(call_a, net.now)
    net.pump()
    assert net.lines()[-2:] == ["BYE sip:gateway@127.0.0.1:5062 SIP/2.0", "SIP/2.0 200 OK"]
    assert net.of_type(a, CallEnded) == [CallEnded(call=call_a, reason="normal clearing", by="local")]
    assert net.of_type(b, CallEnded) == [CallEnded(call=call_b, reason="remote hangup", by="remote")]
    assert a.call_count == 0 and b.call_count == 0
    net.advance(40_000)  # transactions run out their timers quietly
    assert a.next_deadline() is None and b.next_deadline() is None
    assert len(net.log) == 7


def test_an_ended_call_and_its_transactions_are_freed_by_reference_counting() -> None:
    # Reference cycles would leave every ended call to a full GC pass (docs/adr/0006-gc-freeze.md).
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        net, a, b = setup()
        call_a, call_b = place_call(net, a, b)
        calls = [a._core.calls[call_a], b._core.calls[call_b]]  # white-box: the cores' own call objects
        refs = [weakref.ref(call) for call in calls] + [weakref.ref(call.invite_tx) for call in calls]  # type: ignore[arg-type]
        del calls
        a.hang_up(call_a, net.now)
        net.advance(40_000)  # the INVITE and BYE transactions run out their timers
        assert a.next_deadline() is None and b.next_deadline() is None
        assert [ref() for ref in refs] == [None] * 4
    finally:
        gc.enable()


def test_bye_from_callee_and_responses_carry_received_rport() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    b.hang_up(call_b, net.now, reason="agent done")
    net.pump()
    assert net.lines()[-2:] == ["BYE sip:gateway@127.0.0.1:5061 SIP/2.0", "SIP/2.0 200 OK"]
    assert net.of_type(a, CallEnded) == [CallEnded(call=call_a, reason="remote hangup", by="remote")]
    trying = parse_message(next(d.data for d in net.log if d.start_line == "SIP/2.0 100 Trying"))
    assert trying.top_via.rport == 5061 and trying.top_via.received == "127.0.0.1"


def test_lost_invite_is_retransmitted_at_t1() -> None:
    net, a, b = setup()
    net.drop = DropFirst("INVITE", 2)
    a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=OFFER)
    net.advance(499)
    assert net.of_type(b, CallOffered) == []
    net.advance(1)  # Timer A fires at T1 = 500 ms (dropped again), then at +1000 ms
    assert net.of_type(b, CallOffered) == []
    net.advance(1000)
    assert len(net.of_type(b, CallOffered)) == 1
    assert net.lines().count("INVITE sip:agent@127.0.0.1:5062 SIP/2.0") == 3


def test_invite_times_out_with_timer_b_after_seven_sends() -> None:
    net = Net()
    a = net.add(5061)
    call = a.invite("sip:nobody@127.0.0.1:5999", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=OFFER)
    net.advance(31_999)
    assert net.of_type(a, OutboundCallFailed) == []
    net.advance(1)
    assert net.of_type(a, OutboundCallFailed) == [OutboundCallFailed(call=call, status=408, reason="no response")]
    # sends at 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 s (Timer A doubles, uncapped)
    assert len(net.lines()) == 7
    assert net.of_type(a, CallEnded)[0].status == 408  # type: ignore[attr-defined]


def test_reliable_transport_does_not_retransmit() -> None:
    net = Net()
    a = net.add(5061, transports=("tcp",))
    a.invite("sip:nobody@127.0.0.1:5999;transport=tcp", net.now, from_uri="<sip:a@127.0.0.1>", body=OFFER)
    net.advance(32_000)
    assert len(net.lines()) == 1
    assert len(net.of_type(a, OutboundCallFailed)) == 1


def test_lost_200_is_retransmitted_by_the_core_and_lost_ack_resent() -> None:
    net, a, b = setup()
    net.drop = DropFirst("SIP/2.0 200", 2, source=B_ADDR)
    _call_a, _call_b = place_call(net, a, b)
    assert net.of_type(a, OutboundCallAnswered) == []
    net.advance(500)
    assert net.of_type(a, OutboundCallAnswered) == []
    net.advance(1000)  # 2xx retransmitted at T1, 2*T1 (§13.3.1.4)
    assert len(net.of_type(a, OutboundCallAnswered)) == 1
    assert len(net.of_type(b, CallEstablished)) == 1
    # now lose the ACK: the 2xx comes again and the caller ACKs again
    net2, a2, b2 = setup()
    net2.drop = DropFirst("ACK", 1)
    place_call(net2, a2, b2)
    assert net2.of_type(b2, CallEstablished) == []
    net2.advance(500)
    assert len(net2.of_type(b2, CallEstablished)) == 1
    assert net2.lines().count("ACK sip:gateway@127.0.0.1:5062 SIP/2.0") == 2


def test_no_ack_ends_the_call_with_bye_after_64_t1() -> None:
    net, a, b = setup()
    net.drop = lambda source, out: out.data.startswith(b"ACK")
    _call_a, call_b = place_call(net, a, b)
    net.advance(31_999)
    assert net.of_type(b, CallEnded) == []
    net.advance(1)
    assert net.of_type(b, CallEnded) == [CallEnded(call=call_b, reason="no ACK", by="local", status=408)]
    assert "BYE sip:gateway@127.0.0.1:5061 SIP/2.0" in net.lines(source=B_ADDR)
    assert net.of_type(a, CallEnded)[0].by == "remote"  # type: ignore[attr-defined]


def test_cancel_before_answer() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b, answer=False)
    a.hang_up(call_a, net.now, reason="caller gave up")
    net.pump()
    assert net.of_type(b, CallCancelled) == [CallCancelled(call=call_b)]
    assert net.of_type(b, CallEnded) == [CallEnded(call=call_b, reason="cancelled", by="remote", status=487)]
    assert net.of_type(a, CallEnded) == [CallEnded(call=call_a, reason="caller gave up", by="local")]
    assert net.of_type(a, OutboundCallFailed) == []
    assert net.lines()[-4:] == [
        "CANCEL sip:agent@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 200 OK",
        "SIP/2.0 487 Request Terminated",
        "ACK sip:agent@127.0.0.1:5062 SIP/2.0",  # the transaction's ACK for a non-2xx: same Request-URI
    ]
    net.advance(40_000)
    assert a.next_deadline() is None and b.next_deadline() is None


def test_cancel_waits_for_a_provisional() -> None:
    net, a, b = setup()
    net.drop = DropFirst("SIP/2.0 100", 1)
    call_a = a.invite("sip:agent@127.0.0.1:5062", net.now, from_uri="<sip:alice@127.0.0.1:5061>", body=OFFER)
    net.pump()
    a.hang_up(call_a, net.now)
    net.pump()
    assert not any(line.startswith("CANCEL") for line in net.lines())  # §9.1: not before a 1xx
    call_b = net.of_type(b, CallOffered)[0].call  # type: ignore[attr-defined]
    b.ring(call_b, net.now)
    net.pump()
    assert any(line.startswith("CANCEL") for line in net.lines())
    assert net.of_type(b, CallCancelled) == [CallCancelled(call=call_b)]


def test_cancel_crossing_200_ends_with_ack_and_bye() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b, answer=False)
    a.hang_up(call_a, net.now)  # CANCEL sits in A's outbox ...
    b.answer(call_b, net.now, body=ANSWER)  # ... while B's 200 is in flight
    net.pump()
    lines = net.lines()
    assert "CANCEL sip:agent@127.0.0.1:5062 SIP/2.0" in lines
    assert lines.count("SIP/2.0 200 OK") >= 2  # 200 to the INVITE and 200 to the CANCEL
    assert "SIP/2.0 487 Request Terminated" not in lines
    assert "ACK sip:gateway@127.0.0.1:5062 SIP/2.0" in lines
    assert "BYE sip:gateway@127.0.0.1:5062 SIP/2.0" in lines
    assert net.of_type(b, CallCancelled) == []
    assert net.of_type(b, CallEstablished) == [CallEstablished(call=call_b, body=b"")]
    assert net.of_type(b, CallEnded) == [CallEnded(call=call_b, reason="remote hangup", by="remote")]
    assert [e.by for e in net.of_type(a, CallEnded)] == ["local"]  # type: ignore[attr-defined]
    assert net.of_type(a, OutboundCallAnswered) == []


def test_reject_and_hang_up_of_unanswered_call() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b, answer=False)
    b.reject(call_b, net.now, status=486)
    net.pump()
    assert net.of_type(a, OutboundCallFailed) == [OutboundCallFailed(call=call_a, status=486, reason="Busy Here")]
    assert net.lines()[-2:] == ["SIP/2.0 486 Busy Here", "ACK sip:agent@127.0.0.1:5062 SIP/2.0"]
    ended = net.of_type(b, CallEnded)
    assert ended == [CallEnded(call=call_b, reason="rejected", by="local", status=486)]


def test_every_call_ends_with_exactly_one_call_ended() -> None:
    net, a, b = setup()
    calls = [place_call(net, a, b) for _ in range(3)]
    a.hang_up(calls[0][0], net.now)
    b.hang_up(calls[1][1], net.now)
    a.hang_up(calls[2][0], net.now)
    b.hang_up(calls[2][1], net.now)  # both at once: BYEs cross
    net.advance(40_000)
    for endpoint, index in ((a, 0), (b, 1)):
        ended = [e.call for e in net.of_type(endpoint, CallEnded)]  # type: ignore[attr-defined]
        assert sorted(ended) == sorted(c[index] for c in calls)


def test_outbound_uses_the_advertised_address() -> None:
    net = Net()
    a = net.add(5061, advertised_host="203.0.113.7", advertised_port=15060)
    a.invite("sip:x@127.0.0.1:5999", net.now, from_uri="<sip:a@example.com>", body=OFFER)
    invite = parse_message(a.datagrams()[0].data)
    assert isinstance(invite, SipRequest)
    assert invite.top_via.sent_by == ("203.0.113.7", 15060)
    assert invite.contacts[0].uri.host_port() == ("203.0.113.7", 15060)


def test_an_outbound_proxy_takes_the_invite_with_a_loose_route_and_the_request_uri_unchanged() -> None:
    net = Net()
    a = net.add(5061, outbound_proxy="sip:127.0.0.1:5062")  # B plays the proxy (an SBC that answers itself)
    b = net.add(5062)
    call_a = a.invite("sip:+15550100@carrier.invalid", net.now, from_uri="<sip:a@example.com>", body=OFFER)
    [offered] = net.of_type(b, CallOffered)
    [delivery] = [d for d in net.log if d.start_line.startswith("INVITE")]
    assert delivery.destination == B_ADDR and delivery.start_line == "INVITE sip:+15550100@carrier.invalid SIP/2.0"
    invite = parse_message(delivery.data)
    assert isinstance(invite, SipRequest) and invite.headers.values("Route") == ["<sip:127.0.0.1:5062;lr>"]
    # A CANCEL (§9.1) and the ACK of a non-2xx (§17.1.1.3) carry the INVITE's Route, to the same hop.
    a.hang_up(call_a, net.now)
    net.pump()
    sent = [(d.destination, parse_message(d.data)) for d in net.log if d.source == A_ADDR]
    cancel = next(m for _, m in sent if isinstance(m, SipRequest) and m.method == "CANCEL")
    ack = next(m for _, m in sent if isinstance(m, SipRequest) and m.method == "ACK")
    assert cancel.headers.values("Route") == ack.headers.values("Route") == ["<sip:127.0.0.1:5062;lr>"]
    assert {destination for destination, _ in sent} == {B_ADDR}
    assert net.of_type(b, CallCancelled) and offered.request_uri == "sip:+15550100@carrier.invalid"


def test_an_answered_call_through_the_outbound_proxy_goes_on_in_its_dialog() -> None:
    net = Net()
    a = net.add(5061, outbound_proxy="sip:127.0.0.1:5062;transport=udp;lr")
    b = net.add(5062)
    call_a = a.invite("sip:agent@carrier.invalid", net.now, from_uri="<sip:a@example.com>", body=OFFER)
    [offered] = net.of_type(b, CallOffered)
    b.answer(offered.call, net.now, body=ANSWER)  # type: ignore[attr-defined]
    net.pump()
    assert net.of_type(a, OutboundCallAnswered)
    a.hang_up(call_a, net.now)
    net.pump()
    # The proxy did not record-route: the ACK and the BYE go to the remote target, with no Route.
    assert net.lines(source=A_ADDR)[-2:] == [
        "ACK sip:gateway@127.0.0.1:5062 SIP/2.0",
        "BYE sip:gateway@127.0.0.1:5062 SIP/2.0",
    ]
    bye = parse_message(next(d for d in net.log if d.start_line.startswith("BYE")).data)
    assert isinstance(bye, SipRequest) and bye.headers.values("Route") == []
    assert net.of_type(b, CallEnded)


def test_a_secure_target_is_refused_a_plain_outbound_proxy_and_bad_proxies_are_refused() -> None:
    net = Net()
    a = net.add(5061, outbound_proxy="sip:127.0.0.1:5062")
    with pytest.raises(LocalProtocolError, match="TLS on every hop"):
        a.invite("sips:bob@carrier.invalid", net.now, from_uri="<sip:a@example.com>", body=OFFER)
    for bad, message in (
        ("http://proxy", "unsupported URI scheme .http."),
        ("sip:user@proxy.example", "sip: or sips: URI of a host"),
        ("sip:proxy.example;transport=tcp", "reached over tcp"),
        ("sip:[::1", "not a SIP URI"),
    ):
        with pytest.raises(SipConfigError, match=message):
            SipConfig(outbound_proxy=bad, transports=("udp",))


def test_hang_up_before_the_ack_sends_bye_once_it_arrives() -> None:
    net, a, b = setup()
    net.drop = DropFirst("ACK", 1)
    call_a, call_b = place_call(net, a, b)
    b.hang_up(call_b, net.now, reason="changed mind")
    net.pump()
    assert not any(line.startswith("BYE") for line in net.lines())  # §15: not before the ACK
    net.advance(500)  # the 2xx is retransmitted, the caller ACKs again, then the BYE goes
    assert net.lines(source=B_ADDR)[-1] == "BYE sip:gateway@127.0.0.1:5061 SIP/2.0"
    assert net.of_type(b, CallEstablished) == []
    assert net.of_type(b, CallEnded) == [CallEnded(call=call_b, reason="changed mind", by="local")]
    assert net.of_type(a, CallEnded) == [CallEnded(call=call_a, reason="remote hangup", by="remote")]


def test_actions_on_ended_calls_are_ignored_and_illegal_ones_raise() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    with pytest.raises(LocalProtocolError):
        b.answer(call_b, net.now, body=ANSWER)  # answered already
    a.hang_up(call_a, net.now)
    net.pump()
    sent = len(net.log)
    for endpoint, call in ((a, call_a), (b, call_b)):
        endpoint.hang_up(call, net.now)
        endpoint.reinvite(call, net.now, body=OFFER)
        endpoint.send_dtmf_info(call, net.now, digit="1")
    b.answer(call_b, net.now, body=ANSWER)
    net.pump()
    assert len(net.log) == sent
    with pytest.raises(LocalProtocolError):
        a.invite("not a uri", net.now, from_uri="<sip:a@h>", body=b"")


def _brute_force_deadline(endpoint: SipEndpoint) -> float | None:
    core = endpoint._core
    deadlines = [
        d for tx in (*core.client_txs.values(), *core.server_txs.values()) if (d := tx.next_deadline()) is not None
    ]
    for call in core.calls.values():
        deadlines.extend(call.deadlines())
    return min(deadlines) if deadlines else None


def test_next_deadline_from_the_timer_heap_is_the_earliest_of_every_live_timer() -> None:
    # Many calls in every phase: offered, answered (2xx in Accepted), confirmed, ended (BYE transactions
    # running out). The heap must agree with a scan of every transaction and call at every step.
    net, a, b = setup()
    handles = []
    for i in range(40):
        handles.append(place_call(net, a, b, answer=i % 4 != 0))
        net.advance(37)
        if i % 3 == 0:
            a.hang_up(handles[i // 2][0], net.now)
            net.pump()
        for endpoint in (a, b):
            assert endpoint.next_deadline() == _brute_force_deadline(endpoint)
    for _ in range(80):
        net.advance(500)
        for endpoint in (a, b):
            assert endpoint.next_deadline() == _brute_force_deadline(endpoint)
    net.advance(60_000)
    assert a.next_deadline() == _brute_force_deadline(a)
    assert b.next_deadline() == _brute_force_deadline(b)
