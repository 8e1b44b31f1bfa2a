"""The transferee's side of REFER (gateway/sip/refer_sub.py): Refer-To parsing with an embedded Replaces, the
subscription's table, and a whole transfer between two in-memory endpoints (the referrer's own REFER code reads
our NOTIFYs, so their Event, Subscription-State and sipfrag are checked by a second implementation)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sip.errors import LocalProtocolError, RemoteProtocolError
from gateway.sip.events import CallEnded, ReferReceived, TransferDeclined, TransferFailed, TransferProgressed
from gateway.sip.message import SipRequest, parse_message
from gateway.sip.refer_sub import ReferState, ReferSubscription, ReferTarget, parse_refer_to, sipfrag
from gateway.sip.uac import send_in_dialog
from tests.gateway.sip.sipnet import Net
from tests.gateway.sip.test_calls import place_call, setup


def test_refer_to_with_embedded_replaces_is_unescaped_and_taken_out_of_the_uri() -> None:
    target = parse_refer_to(
        ["<sip:bob@pbx.example.com;transport=tcp?Replaces=12345%40host%3Bto-tag%3D1%3Bfrom-tag%3D2>;x=y"]
    )
    assert target == ReferTarget(uri="sip:bob@pbx.example.com;transport=tcp", replaces="12345@host;to-tag=1;from-tag=2")


def test_refer_to_plain_and_tel() -> None:
    assert parse_refer_to(["sip:100@10.0.0.1:5070"]) == ReferTarget(uri="sip:100@10.0.0.1:5070")
    assert parse_refer_to(['"Sales" <tel:+15551234>']) == ReferTarget(uri="tel:+15551234")


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([], "Missing Refer-To"),
        (["<sip:a@h>", "<sip:b@h>"], "More than one Refer-To"),
        (["<http://example.com/>"], "Bad Refer-To: cannot call a http: URI"),
        (["<sip:a@bad host>"], "Bad Refer-To"),
        (["<sip:a@h?Replaces=abc%3Bto-tag%3D1>"], "Bad Refer-To: malformed Replaces"),
    ],
)
def test_bad_refer_to_is_a_400(values: list[str], reason: str) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        parse_refer_to(values)
    assert caught.value.status_code == 400 and caught.value.reason.startswith(reason)


def test_sipfrag_is_one_status_line() -> None:
    assert sipfrag(100, "Trying") == b"SIP/2.0 100 Trying\r\n"
    assert sipfrag(486, " Busy\r\nHere ") == b"SIP/2.0 486 Busy Here\r\n"


def _sub(**kw: object) -> ReferSubscription:
    options: dict[str, object] = {"target": ReferTarget(uri="sip:x@h"), "refer_cseq": 7, "first_in_dialog": True}
    options.update(kw)
    return ReferSubscription(**options)  # type: ignore[arg-type]


def test_subscription_table_accept_progress_final() -> None:
    sub = _sub()
    accepted = sub.accept()
    assert accepted.status == 202 and accepted.notify_body == b"SIP/2.0 100 Trying\r\n"
    assert accepted.notify_headers == (("Event", "refer"), ("Subscription-State", "active;expires=60"))
    ringing = sub.progress(180, "Ringing")
    assert ringing.status is None and ringing.notify_body == b"SIP/2.0 180 Ringing\r\n"
    final = sub.progress(200, "OK")
    assert final.notify_headers[1] == ("Subscription-State", "terminated;reason=noresource")
    assert sub.state is ReferState.TERMINATED and not sub.pending
    assert sub.progress(486, "Busy Here").notify_body == b""  # late: nothing more goes out
    with pytest.raises(LocalProtocolError):
        sub.accept()


def test_later_refer_in_dialog_names_its_subscription_by_cseq() -> None:
    assert _sub(first_in_dialog=False).accept().notify_headers[0] == ("Event", "refer;id=7")


def test_refer_sub_false_gets_no_notify() -> None:
    sub = _sub(subscription=False)
    assert sub.accept().headers == (("Refer-Sub", "false"),) and sub.state is ReferState.UNSUBSCRIBED
    assert sub.progress(200, "OK").notify_body == b""


def test_decline_and_notify_failure() -> None:
    sub = _sub()
    assert sub.decline().status == 603 and sub.state is ReferState.TERMINATED
    with pytest.raises(LocalProtocolError):
        _sub().decline(200)
    active = _sub()
    active.accept()
    active.notify_failed()
    assert active.progress(200, "OK").notify_body == b""


# --- two endpoints: A refers B (the gateway core) ------------------------------------------------


def _notifies(net: Net) -> list[SipRequest]:
    out = []
    for delivery in net.log:
        message = parse_message(delivery.data)
        if isinstance(message, SipRequest) and message.method == "NOTIFY":
            out.append(message)
    return out


def test_accepted_refer_202_then_notify_trying_ringing_ok() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.refer(call_a, net.now, target_uri="sip:human@127.0.0.1:5070")
    net.pump()
    assert net.of_type(b, ReferReceived) == [
        ReferReceived(
            call=call_b,
            refer_to="sip:human@127.0.0.1:5070",
            replaces=None,
            referred_by="<sip:alice@127.0.0.1:5061>",
            subscription=True,
        )
    ]
    b.accept_refer(call_b, net.now)
    b.notify_refer(call_b, net.now, status=180, reason="Ringing")
    b.notify_refer(call_b, net.now, status=200, reason="OK")
    net.pump()
    assert net.of_type(a, TransferProgressed) == [
        TransferProgressed(call=call_a, status=202, reason="Accepted", final=False),
        TransferProgressed(call=call_a, status=100, reason="Trying", final=False),
        TransferProgressed(call=call_a, status=180, reason="Ringing", final=False),
        TransferProgressed(call=call_a, status=200, reason="OK", final=True),
    ]
    notifies = _notifies(net)
    assert [n.headers.get("Subscription-State") for n in notifies] == [
        "active;expires=60",
        "active;expires=60",
        "terminated;reason=noresource",
    ]
    assert {n.headers.get("Content-Type") for n in notifies} == {"message/sipfrag;version=2.0"}
    assert {n.headers.get("Event") for n in notifies} == {"refer"}
    assert "SIP/2.0 202 Accepted" in net.lines()
    # the referrer hangs up its side once the transfer is done; the dialog ends as any other
    a.hang_up(call_a, net.now)
    net.pump()
    assert [e.by for e in net.of_type(b, CallEnded)] == ["remote"]  # type: ignore[attr-defined]


def test_transfer_failure_is_notified_and_the_call_goes_on() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    a.refer(call_a, net.now, target_uri="sip:human@127.0.0.1:5070")
    net.pump()
    b.accept_refer(call_b, net.now)
    b.notify_refer(call_b, net.now, status=486, reason="Busy Here")
    net.pump()
    assert net.of_type(a, TransferFailed) == [TransferFailed(call=call_a, status=486, reason="Busy Here")]
    assert _notifies(net)[-1].body == b"SIP/2.0 486 Busy Here\r\n"
    assert net.of_type(a, CallEnded) == [] and net.of_type(b, CallEnded) == []
    # a second REFER in the same dialog: its NOTIFYs carry id=<its CSeq>
    a.refer(call_a, net.now, target_uri="sip:other@127.0.0.1:5070")
    net.pump()
    b.accept_refer(call_b, net.now)
    net.pump()
    refers = [m for d in net.log if isinstance(m := parse_message(d.data), SipRequest) and m.method == "REFER"]
    assert _notifies(net)[-1].headers.get("Event") == f"refer;id={refers[-1].cseq.number}"


def _refer_by_hand(net: Net, a: object, call_a: object, headers: tuple[tuple[str, str], ...]) -> None:
    send_in_dialog(a._core, a._core.calls[call_a], "REFER", net.now, headers=headers)  # type: ignore[attr-defined]
    net.pump()


def test_refer_without_refer_to_gets_400_and_one_while_pending_gets_491() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    _refer_by_hand(net, a, call_a, ())
    assert net.lines()[-1] == "SIP/2.0 400 Missing Refer-To"
    assert net.of_type(b, TransferDeclined) == [
        TransferDeclined(call=call_b, refer_to="", status=400, reason="Missing Refer-To")
    ]
    _refer_by_hand(
        net, a, call_a, (("Refer-To", "<sip:x@127.0.0.1:5070?Replaces=c1%40h%3Bto-tag%3Da%3Bfrom-tag%3Db>"),)
    )
    received = net.of_type(b, ReferReceived)
    assert [(e.refer_to, e.replaces) for e in received] == [("sip:x@127.0.0.1:5070", "c1@h;to-tag=a;from-tag=b")]  # type: ignore[attr-defined]
    _refer_by_hand(net, a, call_a, (("Refer-To", "<sip:y@127.0.0.1:5070>"),))  # the first is not answered yet
    assert net.lines()[-1] == "SIP/2.0 491 Transfer in progress"
    b.decline_refer(call_b, net.now, status=603, reason="Transfer not allowed")
    net.pump()
    assert net.lines()[-1] == "SIP/2.0 603 Transfer not allowed"
    assert net.of_type(a, CallEnded) == []


def test_refer_sub_false_is_answered_without_notify() -> None:
    net, a, b = setup()
    call_a, call_b = place_call(net, a, b)
    headers = (("Refer-To", "<sip:x@127.0.0.1:5070>"), ("Refer-Sub", "false"), ("Require", "norefersub"))
    _refer_by_hand(net, a, call_a, headers)
    assert [e.subscription for e in net.of_type(b, ReferReceived)] == [False]  # type: ignore[attr-defined]
    b.accept_refer(call_b, net.now)
    b.notify_refer(call_b, net.now, status=200, reason="OK")
    net.pump()
    assert net.lines()[-1] == "SIP/2.0 202 Accepted" and _notifies(net) == []
    with pytest.raises(LocalProtocolError):
        b.accept_refer(call_b, net.now)  # answered already


# --- the table, under any order of the application's calls ---------------------------------------

_STEPS = st.lists(st.sampled_from(["accept", "decline", "progress", "final", "notify_failed"]), min_size=1, max_size=12)


@given(steps=_STEPS, subscription=st.booleans())
def test_any_order_of_steps_answers_once_and_notifies_only_while_active(steps: list[str], subscription: bool) -> None:
    sub = _sub(subscription=subscription)
    answers: list[int] = []
    notifies: list[tuple[bytes, str]] = []
    for step in steps:
        try:
            if step == "accept":
                action = sub.accept()
            elif step == "decline":
                action = sub.decline()
            elif step == "progress":
                action = sub.progress(180, "Ringing")
            elif step == "final":
                action = sub.progress(200, "OK")
            else:
                sub.notify_failed()
                continue
        except LocalProtocolError:
            continue  # the application's mistake, refused without changing anything sent
        if action.status is not None:
            answers.append(action.status)
        if action.notify_body:
            notifies.append((action.notify_body, dict(action.notify_headers)["Subscription-State"]))
    assert len(answers) <= 1  # the REFER is answered once
    if not answers or answers[0] != 202 or not subscription:
        assert notifies == []  # no NOTIFY without an accepted subscription (RFC 4488: none asked for)
    else:
        assert notifies[0][0] == b"SIP/2.0 100 Trying\r\n"
        terminated = [i for i, (_, state) in enumerate(notifies) if state.startswith("terminated")]
        assert terminated in ([], [len(notifies) - 1])  # nothing after the final NOTIFY
