"""Reliable provisional responses, UAS side (RFC 3262 §3, §7): 100rel, RSeq, PRACK.

Owns: `ReliableProvisionals` (one per incoming call whose INVITE says ``Require: 100rel``) and the glue that puts
its decisions on the wire (`send_provisional`, `on_prack`, `fire`). An INVITE that only says ``Supported: 100rel``
keeps unreliable 18x (§3 lets a UAS choose; early media works without PRACK).

    state            input                               -> state            action
    IDLE             18x to send                         -> AWAITING_PRACK   send it with Require: 100rel, RSeq n+1
    AWAITING_PRACK   18x to send                         -> AWAITING_PRACK   queue it (§3: one unacknowledged at a time)
    AWAITING_PRACK   PRACK, RAck matches                 -> IDLE             200; send the next queued 18x / held 2xx
    any              PRACK, RAck matches nothing         -> (unchanged)      481 (§3)
    AWAITING_PRACK   timer (T1, 2*T1, 4*T1, ... no cap)  -> AWAITING_PRACK   retransmit
    AWAITING_PRACK   64*T1 without PRACK                 -> GAVE_UP          500 to the INVITE (§3: SHOULD 5xx)
    AWAITING_PRACK   2xx, the 18x carried SDP            -> AWAITING_PRACK   hold the 2xx until the PRACK (§3: MUST NOT)
    AWAITING_PRACK   other final                         -> FINISHED         send it, stop retransmitting
    IDLE             final                               -> FINISHED         send it

UAC (RFC 3262 §4, `PrackClient`): a reliable 18x on our INVITE (``Require: 100rel`` and an RSeq; a peer that
sends one though we did not offer 100rel gets its PRACK too) is PRACKed once in its early dialog (one per To tag):
the first RSeq of a tag, then only RSeq + 1 (a retransmission or a gap gets none, §4). The confirmed dialog of the
2xx goes on from the early dialog's CSeq (the PRACK took one).

Retransmission does not cap at T2 (§3: unlike a 2xx's, "starts at T1 seconds and doubles for each retransmission").
A PRACK for the last reliable 18x still gets 200 after the final response (it crossed the 2xx on the wire).
The RSeq space starts at a random value in [1, 2**31 - 1] (§3).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .dialog import Dialog
from .errors import RemoteProtocolError
from .transaction import TxState

if TYPE_CHECKING:
    from .call import Call
    from .core import Core
    from .message import SipRequest, SipResponse
    from .transaction import Transaction

OPTION_TAG = "100rel"
MAX_RSEQ = 2**31 - 1


class RelState(enum.Enum):
    IDLE = "idle"
    AWAITING_PRACK = "awaiting_prack"
    GAVE_UP = "gave_up"
    FINISHED = "finished"


class RelInput(enum.Enum):
    PROVISIONAL = "provisional"
    PRACK_MATCHED = "prack_matched"
    TIMER = "timer"
    TIMED_OUT = "timed_out"
    FINAL = "final"
    FINAL_HELD = "final_held"  # a 2xx while the unacknowledged 18x carried a session description


class RelAction(enum.Enum):
    SEND = "send"
    QUEUE = "queue"
    ACKNOWLEDGE = "acknowledge"
    RETRANSMIT = "retransmit"
    GIVE_UP = "give_up"
    HOLD = "hold"
    STOP = "stop"


_TABLE: dict[tuple[RelState, RelInput], tuple[RelState, RelAction]] = {
    (RelState.IDLE, RelInput.PROVISIONAL): (RelState.AWAITING_PRACK, RelAction.SEND),
    (RelState.AWAITING_PRACK, RelInput.PROVISIONAL): (RelState.AWAITING_PRACK, RelAction.QUEUE),
    (RelState.AWAITING_PRACK, RelInput.PRACK_MATCHED): (RelState.IDLE, RelAction.ACKNOWLEDGE),
    (RelState.AWAITING_PRACK, RelInput.TIMER): (RelState.AWAITING_PRACK, RelAction.RETRANSMIT),
    (RelState.AWAITING_PRACK, RelInput.TIMED_OUT): (RelState.GAVE_UP, RelAction.GIVE_UP),
    (RelState.AWAITING_PRACK, RelInput.FINAL_HELD): (RelState.AWAITING_PRACK, RelAction.HOLD),
    (RelState.AWAITING_PRACK, RelInput.FINAL): (RelState.FINISHED, RelAction.STOP),
    (RelState.IDLE, RelInput.FINAL): (RelState.FINISHED, RelAction.STOP),
    (RelState.IDLE, RelInput.FINAL_HELD): (RelState.FINISHED, RelAction.STOP),
}


class PrackError(RemoteProtocolError):
    """A PRACK we cannot take: no RAck or a malformed one (400), or one matching nothing we sent (481)."""


@dataclass(frozen=True, kw_only=True)
class RAck:
    rseq: int
    cseq: int
    method: str


def parse_rack(value: str | None) -> RAck:
    """RFC 3262 §7.2: ``RAck: response-num CSeq-num Method``."""
    parts = (value or "").split()
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        raise PrackError(f"bad RAck {value!r}", status_code=400)
    return RAck(rseq=int(parts[0]), cseq=int(parts[1]), method=parts[2].upper())


@dataclass(kw_only=True)
class _Provisional:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(kw_only=True)
class ReliableProvisionals:
    """The §3 state of one INVITE's reliable 18x; times come from the caller (the injected clock)."""

    t1: float
    next_rseq: int  # the RSeq of the next reliable 18x
    state: RelState = RelState.IDLE
    rseq: int | None = None  # of the last one sent (matched by PRACKs, also once acknowledged or final)
    with_body: bool = False
    data: bytes = b""  # the encoded 18x, for retransmission
    interval: float = 0.0
    next_send: float | None = None
    give_up: float | None = None
    queue: deque[_Provisional] = field(default_factory=deque)
    held_final: Callable[[float], None] | None = None
    pracks: int = 0

    def step(self, event: RelInput) -> RelAction:
        try:
            self.state, action = _TABLE[(self.state, event)]
        except KeyError:
            message = f"no reliable-provisional transition from {self.state.value} on {event.value}"
            raise AssertionError(message) from None
        return action

    def deadlines(self) -> list[float]:
        if self.state is not RelState.AWAITING_PRACK:
            return []
        return [t for t in (self.next_send, self.give_up) if t is not None]

    def matches(self, rack: RAck, invite_cseq: int) -> bool:
        return rack.rseq == self.rseq and rack.cseq == invite_cseq and rack.method == "INVITE"

    def sent(self, data: bytes, *, with_body: bool, now: float) -> None:
        self.data, self.with_body = data, with_body
        self.interval = self.t1
        self.next_send = now + self.t1
        self.give_up = now + 64 * self.t1

    def stopped(self) -> None:
        self.next_send = self.give_up = None
        self.queue.clear()


def for_invite(core: Core, require: frozenset[str]) -> ReliableProvisionals | None:
    """The §3 state for an INVITE requiring 100rel; None (unreliable 18x) when it only supports it, or neither."""
    if OPTION_TAG not in require:
        return None
    return ReliableProvisionals(t1=core.config.timers.t1, next_rseq=core.rng.randint(1, MAX_RSEQ))


def send_provisional(
    core: Core, call: Call, status: int, headers: tuple[tuple[str, str], ...], body: bytes, now: float
) -> None:
    """An 18x for ``call``'s INVITE, sent reliably now or queued behind the unacknowledged one."""
    rel = call.reliable
    assert rel is not None and call.invite_tx is not None
    if rel.step(RelInput.PROVISIONAL) is RelAction.QUEUE:
        rel.queue.append(_Provisional(status=status, headers=headers, body=body))
        return
    rseq = rel.next_rseq
    rel.rseq, rel.next_rseq = rseq, rseq + 1
    reliable_headers = (("Require", OPTION_TAG), ("RSeq", str(rseq)), *headers)
    response = core.respond(call.invite_tx, status, now, to_tag=call.local_tag, headers=reliable_headers, body=body)
    rel.sent(response.encode(), with_body=bool(body), now=now)


def hold_final(call: Call, is_2xx: bool, send: Callable[[float], None], now: float) -> None:
    """A final response to ``call``'s INVITE: sent now (stopping retransmission), or held until the PRACK when
    it is a 2xx and the unacknowledged 18x carried a session description (§3)."""
    rel = call.reliable
    if rel is None or rel.state in (RelState.GAVE_UP, RelState.FINISHED):
        send(now)
        return
    held = is_2xx and rel.state is RelState.AWAITING_PRACK and rel.with_body
    if rel.step(RelInput.FINAL_HELD if held else RelInput.FINAL) is RelAction.HOLD:
        rel.held_final = send
        return
    rel.stopped()
    send(now)


def on_prack(core: Core, call: Call, tx: Transaction, now: float) -> None:
    """A PRACK in the early (or, when it crossed the 2xx, confirmed) dialog: 200 when its RAck names the last
    reliable 18x, else 481; the next queued 18x or the held 2xx goes out once it is acknowledged."""
    rel = call.reliable
    try:
        rack = parse_rack(tx.request.headers.get("RAck"))
        if rel is None or not rel.matches(rack, call.invite.cseq.number):
            raise PrackError("no reliable provisional response matches the RAck", status_code=481)
    except PrackError as exc:
        core.respond(tx, exc.status_code, now, reason=exc.reason[:100] if exc.status_code == 400 else None)
        return
    core.respond(tx, 200, now)
    rel.pracks += 1
    if rel.state is not RelState.AWAITING_PRACK:
        return  # a PRACK that crossed the final response (or a late duplicate): nothing left to stop
    rel.step(RelInput.PRACK_MATCHED)
    rel.next_send = rel.give_up = None
    held, rel.held_final = rel.held_final, None
    if rel.queue and held is None:
        nxt = rel.queue.popleft()
        send_provisional(core, call, nxt.status, nxt.headers, nxt.body, now)
    elif held is not None:
        rel.step(RelInput.FINAL)
        rel.stopped()
        held(now)


def fire(core: Core, call: Call, now: float) -> bool:
    """Retransmit the unacknowledged 18x when due; after 64*T1 reject the INVITE with 500. True when it ended the
    call."""
    rel = call.reliable
    if rel is None or rel.state is not RelState.AWAITING_PRACK:
        return False
    tx = call.invite_tx
    if rel.held_final is None and (tx is None or tx.state is not TxState.PROCEEDING):
        rel.step(RelInput.FINAL)  # a final response went out without us (reject, 487 to a CANCEL or BYE)
        rel.stopped()
        return False
    if rel.give_up is not None and rel.give_up <= now:
        rel.step(RelInput.TIMED_OUT)
        rel.stopped()
        rel.held_final = None
        if tx is not None:
            core.respond(tx, 500, now, reason="No PRACK", to_tag=call.local_tag)
        call.bye_pending = None  # a hang_up() waiting for a held 2xx: there is no dialog left to BYE
        core.end_call(call, reason="no PRACK", by="local", status=500)
        return True
    if rel.next_send is not None and rel.next_send <= now and tx is not None:
        rel.step(RelInput.TIMER)
        core.send(rel.data, tx.peer, tx.transport, flow=tx.flow)
        core.stats.retransmissions_sent += 1
        rel.interval *= 2
        rel.next_send = now + rel.interval
    return False


@dataclass(kw_only=True)
class PrackClient:
    """UAC: the early dialogs (by remote tag) we PRACKed in, and the last RSeq PRACKed in each."""

    dialogs: dict[str, Dialog] = field(default_factory=dict)
    last_rseq: dict[str, int] = field(default_factory=dict)

    def local_seq(self, remote_tag: str) -> int | None:
        dialog = self.dialogs.get(remote_tag)
        return dialog.local_seq if dialog is not None else None


def prack_reliable(core: Core, call: Call, invite: SipRequest, response: SipResponse, now: float) -> bool:
    """UAC: PRACK ``response`` (an 18x to ``invite``) when it is reliable and next in its early dialog's RSeq
    order. True when a PRACK went out."""
    rseq_text = (response.headers.get("RSeq") or "").strip()
    tag = response.to.tag
    if OPTION_TAG not in response.headers.tokens("Require") or not rseq_text.isdigit() or not tag:
        return False
    rseq = int(rseq_text)
    client = call.prack_client
    if client is None:
        client = call.prack_client = PrackClient()
    last = client.last_rseq.get(tag)
    if last is not None and rseq != last + 1:
        return False  # §4: a retransmission (our PRACK's transaction retransmits itself) or out of order
    dialog = client.dialogs.get(tag)
    if dialog is None:
        try:
            dialog = Dialog.for_uac(invite, response, transport=call.transport)
        except RemoteProtocolError:
            core.stats.malformed_dropped += 1  # §12.1.2: no Contact, no early dialog to PRACK in
            return False
        client.dialogs[tag] = dialog
    client.last_rseq[tag] = rseq
    destination, transport, flow = core.next_hop(call, dialog)
    request = dialog.build_request("PRACK", via=core.via(transport))
    request.headers.add("RAck", f"{rseq} {invite.cseq.number} INVITE")
    core.start_client(request, destination, transport, now, context=call, flow=flow)
    return True
