"""Early media: SDP in provisional responses to an initial INVITE, both ways (RFC 3261 §13.2.1, RFC 3960).

Reliable provisional responses (RFC 3262, 100rel): when the INVITE *requires* 100rel, every 18x (the 183 too) is
sent reliably and PRACKed (gateway/sip/prack.py); with ``Supported: 100rel`` alone our 18x stay unreliable. The
rules below hold either way (the 183's answer is the session's answer; the 2xx repeats it).

UAS (a 183 Session Progress we send, ``SipEndpoint.ring(body=...)``):

* §13.2.1: with the offer in the INVITE, the answer is in the 2xx, and "that same exact answer MAY also be placed in
  any provisional responses sent prior to the answer". So a 183 carries the answer of the later 200 byte for byte:
  a second 183 or the 2xx with another body is our bug (:class:`LocalProtocolError`), not a new negotiation.
* An INVITE without an offer gets our offer in the 2xx (§13.2.1: without 100rel no 1xx can carry it), so such an
  INVITE gets no early media: a 183 with a body is refused here; the worker falls back to 180 Ringing.
* The 183 and the 200 carry the same To tag (the call's ``local_tag``): one early dialog becomes the confirmed one.

UAC (18x with SDP on our INVITE, :class:`EarlyDialogs`):

    (no early media)  18x + SDP, to-tag T          -> "start"  media follows this SDP, T is the early dialog
    early on T        18x + SDP, to-tag T          -> "ignore" (§13.2.1: the first description is the answer)
    early on T        18x + SDP, to-tag U != T     -> "ignore" (a second fork: the first fork keeps the media)
    any               18x without SDP              -> "ignore"
    (no early media)  2xx                          -> "take"   the 2xx's SDP is the answer, as without early media
    early on T        2xx on T, same SDP or none   -> "keep"   the media goes on as it is
    early on T        2xx on T, another SDP        -> "take"   (see below)
    early on T        2xx on U != T                -> "take"   the fork that answered wins; its SDP is the answer

Forking: the first fork to send SDP gets the early media; the fork that answers gets the call (the others' dialogs
end with the CANCEL/BYE the core sends). A 2xx on the early dialog with a changed SDP is, read strictly, to be
ignored (§13.2.1); we take it instead, as RFC 6337 §3.1.1 describes common practice (a B2BUA whose announcement
server sent the 183 and whose callee sends the 200): media that follows the 2xx can only be right, the preview
can be stale.
"""

from __future__ import annotations

from typing import Literal

from .errors import LocalProtocolError
from .message import SipRequest

EarlyAction = Literal["start", "ignore"]
AnswerAction = Literal["keep", "take"]


def check_early(invite: SipRequest, sent: bytes, body: bytes) -> bytes:
    """The SDP answer of a 183 to ``invite`` (``sent``: that of an earlier 183, or empty); raises
    :class:`LocalProtocolError` when §13.2.1 forbids it."""
    if not invite.body:
        raise LocalProtocolError(
            "an INVITE without an offer gets our offer in the 2xx: no early media without 100rel (RFC 3261 §13.2.1)"
        )
    if sent and body != sent:
        raise LocalProtocolError("a second 183 must carry the same answer as the first (RFC 3261 §13.2.1)")
    return body


def check_final(early: bytes, body: bytes) -> None:
    """The 2xx after a 183 with ``early`` SDP carries the same exact answer (RFC 3261 §13.2.1)."""
    if early and body != early:
        raise LocalProtocolError("the 2xx must carry the same answer as the 183 before it (RFC 3261 §13.2.1)")


class EarlyDialogs:
    """UAC: which provisional response's SDP the call's media follows before the answer (module docstring)."""

    def __init__(self) -> None:
        self.to_tag: str | None = None  # the early dialog whose SDP the media follows
        self.body = b""
        self.ignored = 0  # 18x with SDP that did not change the media (repeats, other forks)

    @property
    def started(self) -> bool:
        return self.to_tag is not None

    def progressed(self, *, body: bytes, content_type: str | None, to_tag: str | None) -> EarlyAction:
        """An 18x: "start" when its SDP is to start the call's media now."""
        if not body or content_type != "application/sdp" or to_tag is None:
            return "ignore"  # §12.1.2: a 1xx without a To tag makes no early dialog
        if self.to_tag is not None:
            self.ignored += 1
            return "ignore"
        self.to_tag, self.body = to_tag, body
        return "start"

    def answered(self, *, body: bytes, to_tag: str | None) -> AnswerAction:
        """The 2xx: "keep" the early media's negotiation, or "take" the 2xx's SDP as the answer."""
        if self.to_tag is not None and to_tag == self.to_tag and (not body or body == self.body):
            return "keep"
        return "take"
