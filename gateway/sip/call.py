"""Per-call state of the user-agent core: one `Call` per INVITE dialog (one leg of the gateway).

Rules of the call state machine (inputs in the middle, the module that implements them on the right):

    UAS   OFFERED    --ring()-->              OFFERED      180/183 sent                         uas, endpoint
          OFFERED    --ring(body)-->          OFFERED      183 with the SDP answer (early media) endpoint
          OFFERED    --ring(), 100rel-->      OFFERED      reliable 18x until PRACK (prack.py)  prack
          OFFERED    --answer()-->            ANSWERED     2xx sent, retransmitted at T1..T2    endpoint
          OFFERED    --reject()/CANCEL-->     ENDED        3xx-6xx / 487 sent                   endpoint, uas
          ANSWERED   --ACK-->                 CONFIRMED    CallEstablished                       uas
          ANSWERED   --64*T1, no ACK-->       ENDED        BYE sent (§13.3.1.4)                  endpoint
    UAC   CALLING    --1xx-->                 CALLING      OutboundCallProgressed                uac
          CALLING    --2xx-->                 CONFIRMED    ACK sent, OutboundCallAnswered        uac
          CALLING    --401/407, 422-->        CALLING      one retry with credentials / Min-SE   uac
          CALLING    --3xx-6xx, timeout-->    ENDED        OutboundCallFailed                    uac
          CALLING    --hang_up()-->           ENDED        CANCEL (once a 1xx arrived, §9.1)     endpoint
    both  CONFIRMED  --BYE in/out-->          ENDED        CallEnded                             uas, endpoint
          CONFIRMED  --session timer expiry-> ENDED        BYE sent (RFC 4028 §10)               endpoint
A hang_up() in ANSWERED waits for the ACK (or its timeout) before the BYE (§15). A 2xx that arrives
after a CANCEL was sent is ACKed and followed by a BYE (the CANCEL/200 race of §9.1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .auth import ClientCredentials
from .dialog import Dialog
from .events import Address, CallHandle
from .message import SipRequest, SipResponse
from .prack import PrackClient, ReliableProvisionals
from .refer_sub import ReferSubscription
from .session_timer import SessionTimer
from .transaction import Transaction


class CallState(enum.Enum):
    OFFERED = "offered"
    ANSWERED = "answered"
    CALLING = "calling"
    CONFIRMED = "confirmed"
    ENDED = "ended"


@dataclass(kw_only=True)
class Call:
    handle: CallHandle
    role: str  # "uas" | "uac"
    state: CallState
    transport: str
    peer: Address  # where the INVITE came from (UAS) or went (UAC)
    # §12.1.1/§12.1.2: a sips Request-URI over TLS makes the dialog secure (our Contact is then sips too).
    secure: bool = False
    invite: SipRequest  # the latest initial INVITE (ours or theirs)
    local_tag: str
    invite_tx: Transaction | None = None
    dialog: Dialog | None = None
    local_body: bytes = b""
    # UAS: the SDP answer of our 183 (early media); the 2xx must carry the same exact answer (§13.2.1).
    early_body: bytes = b""
    # UAS: the INVITE required 100rel: our 18x are sent reliably and PRACKed (gateway/sip/prack.py).
    reliable: ReliableProvisionals | None = None
    # UAC: the early dialogs a carrier's reliable 18x made, PRACKed (prack.py).
    prack_client: PrackClient | None = None
    local_content_type: str = "application/sdp"
    session_timer: SessionTimer | None = None
    # UAS: our 2xx, retransmitted until the ACK arrives (§13.3.1.4).
    ok_response: SipResponse | None = None
    ok_destination: Address | None = None
    ok_interval: float = 0.0
    ok_next: float | None = None
    ok_give_up: float | None = None
    # A pending re-INVITE or UPDATE, in each direction (§14: one at a time; 491 on glare).
    incoming_update_tx: Transaction | None = None
    outgoing_update_tx: Transaction | None = None
    # UAC: the ACK for the 2xx, resent on 2xx retransmissions.
    ack: SipRequest | None = None
    credentials: ClientCredentials | None = None
    auth_retried: bool = False
    min_se_retried: bool = False
    provisional_seen: bool = False
    cancel_wanted: bool = False
    cancel_sent: bool = False
    bye_pending: str | None = None  # reason of a hang_up() waiting for the ACK
    bye_headers: tuple[tuple[str, str], ...] = ()  # extra headers of our BYE (e.g. an RFC 3326 Reason)
    refer_pending: bool = False
    refresh_in_flight: bool = False  # our outgoing re-INVITE/UPDATE is a session refresh
    end_reported: bool = False
    answer_headers: tuple[tuple[str, str], ...] = ()  # session-timer headers for our 2xx
    peer_allow: frozenset[str] = field(default_factory=frozenset)
    # The peer's REFER (we are the transferee, gateway/sip/refer_sub.py) and how many it sent in this dialog.
    refer_in: ReferSubscription | None = None
    refer_in_tx: Transaction | None = None
    refers_received: int = 0

    def deadlines(self) -> list[float]:
        out: list[float] = []
        if self.ok_next is not None:
            out.append(self.ok_next)
        if self.ok_give_up is not None:
            out.append(self.ok_give_up)
        if self.reliable is not None:
            out.extend(self.reliable.deadlines())
        if self.session_timer is not None and self.state is CallState.CONFIRMED:
            out.append(self.session_timer.deadline)
        return out
