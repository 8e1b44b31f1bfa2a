"""An incoming REFER and the implicit subscription it creates: the transferee's side of RFC 3515 (with the
Replaces of RFC 3891 carried in the Refer-To URI, and RFC 4488's ``Refer-Sub: false``).

Owns: `parse_refer_to` (the one Refer-To of a REFER, its embedded Replaces header taken out of the URI),
`sipfrag` (the NOTIFY body) and `ReferSubscription`, the state of one REFER as a table. Sans-I/O: the endpoint
(gateway/sip/endpoint.py) turns the returned `ReferAction`s into a response and NOTIFY requests; the worker
decides (route policy) and places the new call.

Rules (RFC 3515 §2.4.4-§2.4.7, RFC 4488 §4), keyed on (state, input)::

    RECEIVED     accept        -> ACTIVE        202 Accepted; NOTIFY "SIP/2.0 100 Trying" (Subscription-State:
                                                active;expires=E)
    RECEIVED     accept        -> UNSUBSCRIBED  when the REFER said Refer-Sub: false: 202 with Refer-Sub: false,
                                                and no NOTIFY ever (RFC 4488 §4)
    RECEIVED     decline       -> TERMINATED    the given 4xx-6xx (603 Decline: outside the route's policy)
    ACTIVE       progress 1xx  -> ACTIVE        NOTIFY with the provisional status
    ACTIVE       final >=200   -> TERMINATED    NOTIFY with the final status, Subscription-State: terminated;
                                                reason=noresource (§2.4.7)
    ACTIVE       notify_failed -> TERMINATED    our NOTIFY got 481/408 or timed out: the referrer is gone (RFC 6665
                                                §4.1.2.2), no further NOTIFY
    UNSUBSCRIBED progress/final -> same         nothing is sent
    TERMINATED   progress/final/notify_failed -> TERMINATED  nothing is sent (a late result)
    anything else                               LocalProtocolError (the application's mistake)

The NOTIFYs of the first REFER in a dialog carry ``Event: refer``; those of a later one add ``;id=<CSeq of the
REFER>`` (§2.4.6), which is how the referrer tells the subscriptions apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from urllib.parse import unquote

from .errors import LocalProtocolError, RemoteProtocolError
from .uri import parse_name_addr

#: The implicit subscription's lifetime we announce in active NOTIFYs (RFC 6665 §4.1.3 wants one); a transfer
#: ends well within it (the new INVITE times out after 64*T1 = 32 s).
SUBSCRIPTION_EXPIRES_S = 60
SIPFRAG_CONTENT_TYPE = "message/sipfrag;version=2.0"
_REFER_SCHEMES = ("sip", "sips", "tel")


@dataclass(frozen=True, kw_only=True)
class ReferTarget:
    """Where a REFER sends us: the URI to INVITE (without its headers) and the Replaces it carried, if any."""

    uri: str
    replaces: str | None = None


def parse_refer_to(values: list[str]) -> ReferTarget:
    """The REFER's Refer-To header values -> the target; RemoteProtocolError (400) when there is not exactly one
    usable value (§2.4.1: exactly one Refer-To; a scheme we can INVITE: sip, sips or tel)."""
    if not values:
        raise RemoteProtocolError("Missing Refer-To")
    if len(values) > 1:
        raise RemoteProtocolError("More than one Refer-To")
    try:
        address = parse_name_addr(values[0])
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"Bad Refer-To: {exc.reason}") from None
    uri = address.uri
    if uri.scheme not in _REFER_SCHEMES:
        raise RemoteProtocolError(f"Bad Refer-To: cannot call a {uri.scheme}: URI")
    replaces = None
    for field in uri.headers.split("&") if uri.headers else ():
        name, _, value = field.partition("=")
        if name.lower() == "replaces" and value:
            replaces = unquote(value)  # RFC 3891 §7: escaped inside the URI (%40 for @, %3B for ;, %3D for =)
            if not _replaces_ok(replaces):
                raise RemoteProtocolError("Bad Refer-To: malformed Replaces")
    return ReferTarget(uri=str(replace(uri, headers="")), replaces=replaces)


def _replaces_ok(value: str) -> bool:
    """RFC 3891 §6.1: callid with to-tag and from-tag parameters."""
    call_id, _, params = value.partition(";")
    names = {part.partition("=")[0].strip().lower() for part in params.split(";") if part}
    return bool(call_id.strip()) and {"to-tag", "from-tag"} <= names and "\r" not in value and "\n" not in value


def sipfrag(status: int, reason: str) -> bytes:
    """The NOTIFY body: the status line of the new call's latest response (RFC 3420, RFC 3515 §2.4.5)."""
    clean = " ".join(reason.split()) or "Unknown"
    return f"SIP/2.0 {status} {clean}\r\n".encode()


class ReferState(enum.Enum):
    RECEIVED = "received"
    ACTIVE = "active"
    UNSUBSCRIBED = "unsubscribed"
    TERMINATED = "terminated"


class ReferInput(enum.Enum):
    ACCEPT = "accept"
    DECLINE = "decline"
    PROGRESS = "progress"
    FINAL = "final"
    NOTIFY_FAILED = "notify_failed"


@dataclass(frozen=True, kw_only=True)
class ReferAction:
    """What to send: a response to the REFER (`status`, `headers`) and/or a NOTIFY (`notify_body`,
    `notify_headers`); all empty when nothing goes out."""

    status: int | None = None
    reason: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    notify_body: bytes = b""
    notify_headers: tuple[tuple[str, str], ...] = ()


_S, _I = ReferState, ReferInput
_NEXT: dict[tuple[ReferState, ReferInput], ReferState] = {
    (_S.RECEIVED, _I.ACCEPT): _S.ACTIVE,  # UNSUBSCRIBED instead under Refer-Sub: false
    (_S.RECEIVED, _I.DECLINE): _S.TERMINATED,
    (_S.ACTIVE, _I.PROGRESS): _S.ACTIVE,
    (_S.ACTIVE, _I.FINAL): _S.TERMINATED,
    (_S.ACTIVE, _I.NOTIFY_FAILED): _S.TERMINATED,
    (_S.UNSUBSCRIBED, _I.PROGRESS): _S.UNSUBSCRIBED,
    (_S.UNSUBSCRIBED, _I.FINAL): _S.UNSUBSCRIBED,
    (_S.UNSUBSCRIBED, _I.NOTIFY_FAILED): _S.UNSUBSCRIBED,
    (_S.TERMINATED, _I.PROGRESS): _S.TERMINATED,
    (_S.TERMINATED, _I.FINAL): _S.TERMINATED,
    (_S.TERMINATED, _I.NOTIFY_FAILED): _S.TERMINATED,
}


@dataclass(kw_only=True)
class ReferSubscription:
    """One incoming REFER: answered once (accept/decline), then NOTIFYing the new call's progress."""

    target: ReferTarget
    refer_cseq: int
    first_in_dialog: bool
    subscription: bool = True  # False: the REFER asked for none (Refer-Sub: false, RFC 4488)
    state: ReferState = ReferState.RECEIVED

    @property
    def pending(self) -> bool:
        """Not answered yet, or still owing the referrer a final NOTIFY."""
        return self.state in (ReferState.RECEIVED, ReferState.ACTIVE)

    def accept(self) -> ReferAction:
        self._move(ReferInput.ACCEPT)
        if not self.subscription:
            self.state = ReferState.UNSUBSCRIBED
            return ReferAction(status=202, headers=(("Refer-Sub", "false"),))
        return self._notify(100, "Trying", final=False, status=202)

    def decline(self, status: int = 603, reason: str | None = None) -> ReferAction:
        if not 400 <= status <= 699:
            raise LocalProtocolError("a REFER is declined with a 4xx-6xx")
        self._move(ReferInput.DECLINE)
        return ReferAction(status=status, reason=reason)

    def progress(self, status: int, reason: str) -> ReferAction:
        """The new call's response `status` (1xx provisional; 2xx-6xx final)."""
        if not 100 <= status <= 699:
            raise LocalProtocolError(f"not a SIP status: {status}")
        final = status >= 200
        before = self.state
        self._move(ReferInput.FINAL if final else ReferInput.PROGRESS)
        if before is not ReferState.ACTIVE:
            return ReferAction()
        return self._notify(status, reason, final=final)

    def notify_failed(self) -> None:
        self._move(ReferInput.NOTIFY_FAILED)

    def _move(self, what: ReferInput) -> None:
        after = _NEXT.get((self.state, what))
        if after is None:
            raise LocalProtocolError(f"REFER subscription: {what.value} in state {self.state.value}")
        self.state = after

    def _notify(self, frag_status: int, reason: str, *, final: bool, status: int | None = None) -> ReferAction:
        event = "refer" if self.first_in_dialog else f"refer;id={self.refer_cseq}"
        state = "terminated;reason=noresource" if final else f"active;expires={SUBSCRIPTION_EXPIRES_S}"
        headers = (("Event", event), ("Subscription-State", state))
        return ReferAction(status=status, notify_body=sipfrag(frag_status, reason), notify_headers=headers)
