"""Transaction state tables (RFC 3261 §17 + RFC 6026): timer schedules as data and table properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sip.message import SipRequest, SipResponse, make_response, parse_message
from gateway.sip.timers import SipTimers
from gateway.sip.transaction import (
    INITIAL_STATE,
    TABLES,
    ResponsePassed,
    Transaction,
    TransactionTimedOut,
    Transmit,
    TxInput,
    TxKind,
    TxState,
)

TIMERS = SipTimers(t1=0.5, t2=4.0, t4=5.0)


def _request(method: str) -> SipRequest:
    data = (
        f"{method} sip:b@127.0.0.1:5062 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bKx\r\n"
        f"From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: c\r\nCSeq: 1 {method}\r\n\r\n"
    ).encode()
    request = parse_message(data)
    assert isinstance(request, SipRequest)
    return request


def _transmit_times(kind: TxKind, transport: str, until: float, *, respond: int | None = None) -> list[float]:
    method = "INVITE" if kind in (TxKind.INVITE_CLIENT, TxKind.INVITE_SERVER) else "OPTIONS"
    tx, effects = Transaction.start(
        kind, _request(method), peer=("127.0.0.1", 5062), transport=transport, timers=TIMERS, now=0.0
    )
    times = [0.0 for e in effects if isinstance(e, Transmit)]
    if respond is not None:
        times = [
            0.0 for e in tx.respond(make_response(tx.request, respond, to_tag="t"), 0.0) if isinstance(e, Transmit)
        ]
    now = 0.0
    while (deadline := tx.next_deadline()) is not None and deadline <= until:
        now = deadline
        times.extend(now for e in tx.fire_due(now) if isinstance(e, Transmit))
    return times


def test_timer_a_doubles_without_cap_and_b_ends_it() -> None:
    assert _transmit_times(TxKind.INVITE_CLIENT, "udp", 100) == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5]


def test_timer_e_caps_at_t2_and_f_ends_it() -> None:
    times = _transmit_times(TxKind.NON_INVITE_CLIENT, "udp", 100)
    assert times[:6] == [0.0, 0.5, 1.5, 3.5, 7.5, 11.5]
    assert times[-1] == 31.5 and len(times) == 11


def test_timer_g_retransmits_error_response_until_h() -> None:
    times = _transmit_times(TxKind.INVITE_SERVER, "udp", 100, respond=486)
    assert times[:5] == [0.0, 0.5, 1.5, 3.5, 7.5] and times[-1] <= 32.0


def test_reliable_transport_has_no_retransmissions_and_zero_wait_timers() -> None:
    assert _transmit_times(TxKind.INVITE_CLIENT, "tcp", 100) == [0.0]
    tx, _ = Transaction.start(
        TxKind.NON_INVITE_CLIENT, _request("OPTIONS"), peer=("h", 1), transport="tcp", timers=TIMERS, now=0.0
    )
    response = make_response(tx.request, 200, to_tag="t")
    effects = tx.receive_response(response, 1.0)
    assert effects == [ResponsePassed(response=response)]
    assert tx.state is TxState.TERMINATED  # Timer K is 0 on reliable transports


def test_invite_client_acks_non_2xx_itself_and_passes_2xx_retransmissions() -> None:
    tx, _ = Transaction.start(
        TxKind.INVITE_CLIENT, _request("INVITE"), peer=("h", 1), transport="udp", timers=TIMERS, now=0.0
    )
    busy = make_response(tx.request, 486, to_tag="t")
    effects = tx.receive_response(busy, 0.1)
    assert [type(e) for e in effects] == [Transmit, ResponsePassed]
    ack = parse_message(effects[0].data)  # type: ignore[union-attr]
    assert isinstance(ack, SipRequest) and ack.method == "ACK" and ack.top_via.branch == "z9hG4bKx"
    assert ack.to.tag == "t" and ack.cseq.number == 1
    assert tx.receive_response(busy, 0.2) == [Transmit(data=ack.encode())]  # retransmitted 486: ACK again
    ok_tx, _ = Transaction.start(
        TxKind.INVITE_CLIENT, _request("INVITE"), peer=("h", 1), transport="udp", timers=TIMERS, now=0.0
    )
    ok = make_response(ok_tx.request, 200, to_tag="t")
    assert ok_tx.receive_response(ok, 0.1) == [ResponsePassed(response=ok)]
    assert ok_tx.state is TxState.ACCEPTED
    assert ok_tx.receive_response(ok, 0.2) == [ResponsePassed(response=ok)]  # RFC 6026: to the TU again
    assert ok_tx.fire_due(0.1 + 32.0) == [] and ok_tx.state is TxState.TERMINATED  # Timer M


def test_timeouts_are_reported() -> None:
    tx, _ = Transaction.start(
        TxKind.INVITE_SERVER, _request("INVITE"), peer=("h", 1), transport="udp", timers=TIMERS, now=0.0
    )
    tx.respond(make_response(tx.request, 480, to_tag="t"), 0.0)
    effects = tx.fire_due(32.0)
    assert TransactionTimedOut() in effects and tx.state is TxState.TERMINATED  # Timer H: no ACK


# Timer inputs come from fire_due only; the random part is which messages arrive, and when.
_INPUTS = [event for event in TxInput if not event.name.startswith("TIMER_")]


@pytest.mark.parametrize("kind", list(TxKind))
@given(steps=st.lists(st.tuples(st.sampled_from(_INPUTS), st.floats(0, 5)), max_size=40))
def test_tables_are_closed_and_terminated_absorbs(kind: TxKind, steps: list[tuple[TxInput, float]]) -> None:
    """Any message sequence at any pace: the state stays among the table's states, Terminated is final, and
    after firing what is due no deadline lies in the past."""
    table = TABLES[kind]
    states = {INITIAL_STATE[kind], TxState.TERMINATED} | {s for s, _ in table} | {n for n, _ in table.values()}
    method = "INVITE" if kind in (TxKind.INVITE_CLIENT, TxKind.INVITE_SERVER) else "OPTIONS"
    tx, _ = Transaction.start(kind, _request(method), peer=("h", 1), transport="udp", timers=TIMERS, now=0.0)
    now = 0.0
    for event, delta in steps:
        now += delta
        before = tx.state
        tx.fire_due(now)
        response: SipResponse | None = None
        if event.name.startswith(("TU_", "RESPONSE_")):
            status = {"1XX": 180, "2XX": 200}.get(event.name.split("_")[-1], 486)
            response = make_response(tx.request, status, to_tag="t")
        tx.handle(event, now, response=response)
        assert tx.state in states
        if before is TxState.TERMINATED:
            assert tx.state is TxState.TERMINATED
        assert all(deadline >= now for deadline in tx.deadlines.values())
    tx.fire_due(now + 1000)
    assert (
        tx.state is TxState.TERMINATED
        or (kind is TxKind.INVITE_CLIENT and tx.state is TxState.PROCEEDING)
        or (
            kind in (TxKind.INVITE_SERVER, TxKind.NON_INVITE_SERVER)
            and tx.state in (TxState.PROCEEDING, TxState.TRYING)
        )
    )  # only states that wait for a message (a final response / the TU) have no timer of their own
