"""Reliable provisional responses as a UAS (RFC 3262 §3): Require: 100rel + RSeq on every 18x, one unacknowledged
at a time, retransmitted at T1, 2*T1, ... until the PRACK (200) or for 64*T1 (then 500 to the INVITE); a PRACK that
matches nothing gets 481; an INVITE that only supports 100rel keeps unreliable 18x."""

from __future__ import annotations

from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import CallEnded, CallEstablished, CallHandle, CallOffered, OutboundCallAnswered
from gateway.sip.message import SipRequest, SipResponse, parse_message
from gateway.sip.prack import MAX_RSEQ, RAck, RelAction, ReliableProvisionals, RelInput, RelState, parse_rack
from tests.gateway.sip.sipnet import DropFirst
from tests.gateway.sip.test_calls import ANSWER, OFFER, setup
from tests.gateway.sip.test_torture import PEER, endpoint, request

T1 = 0.5  # SipTimers' default


def _invite(ep: SipEndpoint, extra: str = "Require: 100rel\r\nSupported: 100rel\r\n") -> tuple[str, list[bytes]]:
    ep.receive(request(method="INVITE", extra=extra, body=OFFER.decode()), PEER, transport="udp", now=0.0)
    (offered,) = [e for e in ep.events() if isinstance(e, CallOffered)]
    return offered.call, [d.data for d in ep.datagrams()]


def _responses(data: list[bytes]) -> list[SipResponse]:
    out = [parse_message(d) for d in data]
    assert all(isinstance(r, SipResponse) for r in out)
    return out  # type: ignore[return-value]


def _prack(rack: str, to_tag: str, *, cseq: int = 2, branch: str = "z9hG4bKp1") -> bytes:
    lines = [
        "PRACK sip:agent@127.0.0.1:5062 SIP/2.0",
        f"Via: SIP/2.0/UDP 127.0.0.1:5070;branch={branch};rport",
        "Max-Forwards: 70",
        "From: <sip:tester@127.0.0.1:5070>;tag=t1",
        f"To: <sip:agent@127.0.0.1:5062>;tag={to_tag}",
        "Call-ID: torture-1@127.0.0.1",
        f"CSeq: {cseq} PRACK",
        f"RAck: {rack}",
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _send(ep: SipEndpoint, data: bytes, now: float) -> list[SipResponse]:
    ep.receive(data, PEER, transport="udp", now=now)
    return _responses([d.data for d in ep.datagrams()])


def _tick(ep: SipEndpoint, now: float) -> list[SipResponse]:
    ep.handle_timers(now)
    return _responses([d.data for d in ep.datagrams()])


def test_require_100rel_is_accepted_and_18x_are_reliable_with_increasing_rseq() -> None:
    ep = endpoint()
    call, sent = _invite(ep)
    assert [r.status for r in _responses(sent)] == [100]  # never a reliable 100 (§3)
    ep.ring(call, 0.0)  # 180
    ep.ring(call, 0.0, status=183, body=ANSWER)  # queued: one unacknowledged at a time
    (ringing,) = _responses([d.data for d in ep.datagrams()])
    assert ringing.status == 180 and ringing.headers.get("Require") == "100rel"
    rseq = int(ringing.headers.get("RSeq") or "0")
    assert 1 <= rseq <= MAX_RSEQ
    assert ringing.to.tag is not None
    ok, progress = _send(ep, _prack(f"{rseq} 1 INVITE", ringing.to.tag), 0.1)  # the PRACK frees the queued 183
    assert ok.status == 200 and ok.cseq.method == "PRACK"
    assert progress.status == 183 and progress.body == ANSWER
    assert progress.headers.get("Require") == "100rel" and progress.headers.get("RSeq") == str(rseq + 1)


def test_retransmitted_at_t1_doubling_without_cap_until_the_prack() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0, status=183, body=ANSWER)
    (first,) = _responses([d.data for d in ep.datagrams()])
    times = []
    now = 0.0
    while len(times) < 5:
        deadline = ep.next_deadline()
        assert deadline is not None
        now = deadline
        out = _tick(ep, now)
        if out:
            assert [r.headers.get("RSeq") for r in out] == [first.headers.get("RSeq")]
            times.append(round(now, 3))
    # T1, 2*T1, 4*T1, 8*T1, 16*T1 apart: 4 s and 8 s exceed T2 (4 s): RFC 3262 §3 has no cap
    assert times == [0.5, 1.5, 3.5, 7.5, 15.5]
    assert first.to.tag is not None
    (ok,) = _send(ep, _prack(f"{first.headers.get('RSeq')} 1 INVITE", first.to.tag), now + 0.1)
    assert ok.status == 200
    assert _tick(ep, 60.0) == []  # stopped: no retransmission, no 500
    assert ep.call_count == 1


def test_unmatched_prack_gets_481_and_a_bad_rack_400() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0)
    (ringing,) = _responses([d.data for d in ep.datagrams()])
    rseq = int(ringing.headers.get("RSeq") or "0")
    assert ringing.to.tag is not None
    assert [r.status for r in _send(ep, _prack(f"{rseq + 1} 1 INVITE", ringing.to.tag), 0.1)] == [481]
    assert [r.status for r in _send(ep, _prack(f"{rseq} 7 INVITE", ringing.to.tag, cseq=3, branch="b3"), 0.1)] == [481]
    assert [r.status for r in _send(ep, _prack("nonsense", ringing.to.tag, cseq=4, branch="b4"), 0.1)] == [400]
    assert [r.status for r in _send(ep, _prack(f"{rseq} 1 INVITE", "other", cseq=5, branch="b5"), 0.1)] == [481]
    assert [r.status for r in _send(ep, _prack(f"{rseq} 1 INVITE", ringing.to.tag, cseq=6, branch="b6"), 0.1)] == [200]


def test_no_prack_for_64_t1_rejects_the_invite_with_500() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0)
    ep.datagrams()
    statuses = []
    for step in range(1, 70):
        statuses += [r.status for r in _tick(ep, step * T1)]
    first_500 = statuses.index(500)  # then retransmitted by the transaction until an ACK (timer G)
    assert statuses[:first_500] == [180] * 6  # at 0.5, 1.5, 3.5, 7.5, 15.5, 31.5; the 500 at 64*T1 = 32
    assert set(statuses[first_500:]) == {500}
    ended = [e for e in ep.events() if isinstance(e, CallEnded)]
    assert ended == [CallEnded(call=call, reason="no PRACK", by="local", status=500)]


def test_2xx_waits_for_the_prack_of_a_183_with_sdp() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0, status=183, body=ANSWER)
    (progress,) = _responses([d.data for d in ep.datagrams()])
    ep.answer(call, 0.2, body=ANSWER)
    assert ep.datagrams() == []  # §3: no final response before the PRACK of an 18x with a session description
    assert progress.to.tag is not None
    out = _send(ep, _prack(f"{progress.headers.get('RSeq')} 1 INVITE", progress.to.tag), 0.3)
    assert [(r.status, r.cseq.method) for r in out] == [(200, "PRACK"), (200, "INVITE")]
    assert out[1].body == ANSWER and out[1].to.tag == progress.to.tag


def test_2xx_after_an_unacknowledged_180_goes_at_once_and_stops_it() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0)
    (ringing,) = _responses([d.data for d in ep.datagrams()])
    ep.answer(call, 0.2, body=ANSWER)
    assert [r.status for r in _responses([d.data for d in ep.datagrams()])] == [200]
    assert all(r.status != 180 for r in _tick(ep, 2.0))
    assert ringing.to.tag is not None  # a PRACK that crossed the 2xx is still answered 200
    assert [r.status for r in _send(ep, _prack(f"{ringing.headers.get('RSeq')} 1 INVITE", ringing.to.tag), 2.1)] == [
        200
    ]


def test_supported_only_keeps_unreliable_18x_and_responses_advertise_100rel() -> None:
    ep = endpoint()
    call, _ = _invite(ep, extra="Supported: 100rel, timer\r\n")
    ep.ring(call, 0.0, status=183, body=ANSWER)
    (progress,) = _responses([d.data for d in ep.datagrams()])
    assert progress.headers.get("RSeq") is None and progress.headers.get("Require") is None
    assert _tick(ep, 5.0) == []
    ep.answer(call, 0.2, body=ANSWER)
    (ok,) = _responses([d.data for d in ep.datagrams()])
    assert "100rel" in ok.headers.tokens("Supported") and "prack" in ok.headers.tokens("Allow")
    options = _send(endpoint(), request(method="OPTIONS", branch="z9hG4bKo"), 0.0)
    assert "100rel" in options[0].headers.tokens("Supported")


def test_the_table_refuses_what_it_does_not_list() -> None:
    rel = ReliableProvisionals(t1=T1, next_rseq=1)
    assert rel.step(RelInput.PROVISIONAL) is RelAction.SEND
    assert rel.step(RelInput.PROVISIONAL) is RelAction.QUEUE
    assert rel.step(RelInput.PRACK_MATCHED) is RelAction.ACKNOWLEDGE and rel.state is RelState.IDLE
    assert parse_rack("776656 1 invite") == RAck(rseq=776656, cseq=1, method="INVITE")
    try:
        rel.step(RelInput.TIMER)
    except AssertionError as exc:
        assert "idle" in str(exc)
    else:
        raise AssertionError("TIMER in IDLE must not pass")


def _cancel() -> bytes:
    lines = [
        "CANCEL sip:agent@127.0.0.1:5062 SIP/2.0",
        "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKt1;rport",
        "Max-Forwards: 70",
        "From: <sip:tester@127.0.0.1:5070>;tag=t1",
        "To: <sip:agent@127.0.0.1:5062>",
        "Call-ID: torture-1@127.0.0.1",
        "CSeq: 1 CANCEL",
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_cancel_while_the_2xx_waits_for_the_prack_ends_the_call_with_487() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0, status=183, body=ANSWER)
    ep.answer(call, 0.2, body=ANSWER)
    ep.datagrams()
    ep.events()
    out = _send(ep, _cancel(), 0.3)
    assert [(r.status, r.cseq.method) for r in out] == [(200, "CANCEL"), (487, "INVITE")]
    assert [type(e).__name__ for e in ep.events()] == ["CallCancelled", "CallEnded"]
    assert all(r.status != 200 for r in _tick(ep, 40.0))  # the held 2xx never goes out
    assert ep.call_count == 0


def test_a_reject_stops_the_retransmission_of_an_unacknowledged_18x() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0)
    ep.reject(call, 0.1, status=486)
    assert [r.status for r in _responses([d.data for d in ep.datagrams()])] == [180, 486]
    later = [r.status for step in range(1, 80) for r in _tick(ep, step * T1)]
    assert 180 not in later and 500 not in later


def test_hang_up_while_the_2xx_waits_then_no_prack_ends_with_500_and_forgets_the_call() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0, status=183, body=ANSWER)
    ep.answer(call, 0.1, body=ANSWER)
    ep.hang_up(call, 0.2)
    statuses = [r.status for step in range(1, 70) for r in _tick(ep, step * T1)]
    assert 500 in statuses and 200 not in statuses
    assert ep.call_count == 0 and ep.next_deadline() is not None  # only the INVITE transaction's timers are left
    assert [e for e in ep.events() if isinstance(e, CallEnded)] == [
        CallEnded(call=call, reason="normal clearing", by="local", status=None)
    ]


def test_bye_in_the_early_dialog_while_the_2xx_waits_gets_200_and_487() -> None:
    ep = endpoint()
    call, _ = _invite(ep)
    ep.ring(call, 0.0, status=183, body=ANSWER)
    (progress,) = _responses([d.data for d in ep.datagrams()])
    ep.answer(call, 0.1, body=ANSWER)
    assert progress.to.tag is not None
    bye = _prack("0 1 INVITE", progress.to.tag).replace(b"PRACK", b"BYE")
    out = _send(ep, bye, 0.2)
    assert [(r.status, r.cseq.method) for r in out] == [(200, "BYE"), (487, "INVITE")]
    assert ep.call_count == 0


def _invite_requiring_100rel(a: SipEndpoint, now: float) -> CallHandle:
    """``a`` (our UAC) INVITEs ``b`` with an offer, as a peer that requires reliable 18x would."""
    return a.invite(
        "sip:agent@127.0.0.1:5062",
        now,
        from_uri="<sip:alice@127.0.0.1:5061>",
        body=OFFER,
        headers=(("Require", "100rel"),),
    )


def test_our_uac_pracks_reliable_18x_and_the_dialog_goes_on_past_the_prack_cseq() -> None:
    net, a, b = setup()
    call_a = _invite_requiring_100rel(a, net.now)
    call_b = net.of_type(b, CallOffered)[-1].call
    b.ring(call_b, net.now)
    b.ring(call_b, net.now, status=183, body=ANSWER)  # goes out when the 180 is PRACKed
    net.pump()
    b.answer(call_b, net.now, body=ANSWER)
    net.pump()
    sent = [parse_message(d.data) for d in net.log if not d.dropped]
    pracks = [m for m in sent if isinstance(m, SipRequest) and m.method == "PRACK"]
    reliable = [m for m in sent if isinstance(m, SipResponse) and m.status in (180, 183)]
    assert [r.headers.get("RSeq") for r in reliable] == [(p.headers.get("RAck") or "").split()[0] for p in pracks]
    assert [p.cseq.number for p in pracks] == [2, 3]
    assert [type(e).__name__ for e in net.of_type(a, OutboundCallAnswered)] == ["OutboundCallAnswered"]
    assert net.of_type(b, CallEstablished) == [CallEstablished(call=call_b, body=b"")]
    a.hang_up(call_a, net.now)
    net.pump()
    bye = [m for m in (parse_message(d.data) for d in net.log) if isinstance(m, SipRequest) and m.method == "BYE"]
    assert [m.cseq.number for m in bye] == [4]  # after the PRACKs' CSeqs: b takes it (no 500)
    assert net.of_type(b, CallEnded)[-1].by == "remote" and net.lines()[-1].startswith("SIP/2.0 200")
    net.advance(40_000)
    assert "SIP/2.0 500 No PRACK" not in net.lines()


def test_a_retransmitted_reliable_18x_gets_no_second_prack_the_lost_prack_is_retransmitted() -> None:
    net, a, b = setup()
    net.drop = DropFirst("PRACK", 1)
    _invite_requiring_100rel(a, net.now)
    call_b = net.of_type(b, CallOffered)[-1].call
    b.ring(call_b, net.now, status=183, body=ANSWER)
    net.advance(2_000)
    pracks = [parse_message(d.data) for d in net.log if d.start_line.startswith("PRACK")]
    assert len(pracks) == 2 and len({p.cseq.number for p in pracks}) == 1  # the lost one, then its retransmission
    assert len([line for line in net.lines() if line.startswith("SIP/2.0 183")]) >= 2  # b retransmitted meanwhile
    b.answer(call_b, net.now, body=ANSWER)
    assert net.of_type(b, CallEstablished) == [CallEstablished(call=call_b, body=b"")]
