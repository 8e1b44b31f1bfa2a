"""How the registration client reads a registrar's final response to a REGISTER (RFC 3261 §10.2.4, §10.3, §22).

Owns: `read_reply`, a pure function from a final response (or None: no response within Timer F) and what the
client knew when it sent the request (`Asked`) to a `Reply`: its kind, which is the state table's input in
registration.py, and the details the table's actions need (the granted time, the challenge to answer, the
Min-Expires to ask for, the Retry-After to honour, the reason to report). The rules it applies are listed in
registration.py's docstring; the reasons it writes name the registrar, realm and user, for operators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .digest import DigestChallenge, DigestError, select_challenge
from .errors import RemoteProtocolError
from .events import RegistrationOutcome
from .message import SipResponse
from .uri import NameAddr, SipUri, parse_name_addr

ReplyKind = Literal["accepted", "challenged", "too_brief", "refused", "timed_out"]

MAX_STALE_ANSWERS = 2  # stale=true challenges answered per attempt
MAX_TOO_BRIEF_ANSWERS = 2  # 423s answered per attempt
MAX_DELTA_SECONDS = 2**31 - 1  # §20.19


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What the request asked and what its attempt had done so far."""

    registrar: str
    username: str | None
    has_password: bool
    expires: int  # asked for (0: a removal)
    contact_uri: SipUri
    instance_id: str | None
    answered: bool  # the attempt already answered a challenge it received
    stale_answers: int
    too_brief_answers: int
    timeout_s: float


@dataclass(frozen=True, kw_only=True)
class Reply:
    kind: ReplyKind
    status: int
    reason: str = ""
    outcome: RegistrationOutcome = "rejected"
    expires: int = 0  # granted (accepted)
    contact_listed: bool = False
    other_contacts: int = 0
    retry_after: float | None = None
    challenge: tuple[str, DigestChallenge] | None = None  # (header to answer with, challenge) when challenged
    min_expires: int | None = None  # too_brief


def read_reply(response: SipResponse | None, asked: Asked) -> Reply:
    registrar = asked.registrar
    if response is None:
        return Reply(
            kind="timed_out",
            status=408,
            reason=f"no response from {registrar} within {asked.timeout_s:g} s",
            outcome="timeout",
        )
    status = response.status
    if 200 <= status < 300:
        return Reply(kind="accepted", status=status) if asked.expires == 0 else _grant(response, asked)
    if status in (401, 407):
        return _challenge(response, asked)
    if status == 423:
        return _too_brief(response, asked)
    reason = f"{registrar} answered {status} {response.reason}".rstrip()
    if 300 <= status < 400:
        contact = response.headers.get("Contact")
        reason += f" (it redirects to {contact[:120]}; register there instead)" if contact else ""
    return Reply(kind="refused", status=status, reason=reason, retry_after=retry_after(response))


def _grant(response: SipResponse, asked: Asked) -> Reply:
    ours: NameAddr | None = None
    others = 0
    for value in response.headers.values("Contact"):
        try:
            listed = parse_name_addr(value)
        except RemoteProtocolError:
            continue
        if ours is None and _is_ours(listed, asked):
            ours = listed
        else:
            others += 1
    granted = delta_seconds(ours.param("expires")) if ours is not None else None
    if granted is None:
        granted = delta_seconds(response.headers.get("Expires"))
    if granted is None:
        granted = asked.expires
    if granted <= 0:
        return Reply(
            kind="refused",
            status=response.status,
            reason=f"{asked.registrar} answered {response.status} but granted 0 s to our contact",
        )
    return Reply(
        kind="accepted", status=response.status, expires=granted, contact_listed=ours is not None, other_contacts=others
    )


def _is_ours(listed: NameAddr, asked: Asked) -> bool:
    """Our contact in a 2xx: the same +sip.instance when both carry one, else the same URI (§19.1.4, loosely)."""
    instance = listed.param("+sip.instance")
    if asked.instance_id is not None and instance is not None:
        return instance.strip("<>") == asked.instance_id
    uri, mine = listed.uri, asked.contact_uri
    return (
        uri.scheme == mine.scheme
        and uri.user == mine.user
        and uri.host.lower() == mine.host.lower()
        and uri.host_port()[1] == mine.host_port()[1]
        and uri.transport == mine.transport
    )


def _challenge(response: SipResponse, asked: Asked) -> Reply:
    status = response.status
    registrar, user = asked.registrar, asked.username
    header = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"
    answer_with = "Authorization" if status == 401 else "Proxy-Authorization"

    def refused(reason: str) -> Reply:
        return Reply(kind="refused", status=status, reason=reason, outcome="auth_rejected")

    try:
        challenge = select_challenge(response.headers.lines(header))
    except DigestError as exc:
        return refused(f"{registrar} asks for credentials ({status}) with a challenge we cannot answer: {exc.reason}")
    realm = challenge.realm
    if user is None or not asked.has_password:
        return refused(f"{registrar} asks for credentials ({status}, realm {realm!r}) and none are configured")
    if challenge.qop and "auth" not in challenge.qop:
        return refused(f"{registrar} offers only qop={','.join(challenge.qop)} (realm {realm!r}); we answer qop=auth")
    if asked.answered and not (challenge.stale and asked.stale_answers < MAX_STALE_ANSWERS):
        again = "stale again" if challenge.stale else "again"
        return refused(
            f"{registrar} refused the credentials of user {user!r} for realm {realm!r} ({status} {again} after our "
            "answer): check the trunk's username and password"
        )
    return Reply(kind="challenged", status=status, challenge=(answer_with, challenge))


def _too_brief(response: SipResponse, asked: Asked) -> Reply:
    minimum = delta_seconds(response.headers.get("Min-Expires"))
    if (
        asked.expires == 0
        or minimum is None
        or minimum <= asked.expires
        or asked.too_brief_answers >= MAX_TOO_BRIEF_ANSWERS
    ):
        shown = "no usable Min-Expires" if minimum is None else f"Min-Expires {minimum}"
        return Reply(
            kind="refused",
            status=423,
            reason=f"{asked.registrar} answered 423 Interval Too Brief ({shown}) to expires {asked.expires}",
        )
    return Reply(kind="too_brief", status=423, min_expires=minimum)


def delta_seconds(text: str | None) -> int | None:
    """A delta-seconds value (§25.1), or None when absent or not one; huge values are capped (§20.19)."""
    if text is None:
        return None
    value = text.strip()
    if not value or not value.isascii() or not value.isdigit():
        return None
    return min(int(value[:12]), MAX_DELTA_SECONDS)


def retry_after(response: SipResponse) -> float | None:
    """§20.33: ``Retry-After: 120 (comment);duration=...``: the delta-seconds before any comment or parameter."""
    header = response.headers.get("Retry-After")
    if header is None:
        return None
    seconds = delta_seconds(header.split("(", 1)[0].split(";", 1)[0])
    return float(seconds) if seconds is not None else None
