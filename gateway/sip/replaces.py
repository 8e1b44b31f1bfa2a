"""Our side of RFC 3891 as the transferor: the Refer-To that hands a joined call to the far ends (sans-I/O).

Owns: :func:`replaces_value` (the Replaces header of a dialog of ours, tags as the *other* end of it sees them),
:func:`escape_header_value` (RFC 3261 §19.1.1's escaping of a URI header value), :func:`refer_to_replacing`
(the peer's Contact with ``?Replaces=...``) and :func:`offers_replaces` (an INVITE's Allow and Supported say the
peer can be REFERred with a Replaces). gateway/sip/refer_sub.py parses the same URIs when we are referred.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from urllib.parse import quote

from .uri import parse_uri

# RFC 3261 §25.1: hvalue = *( hnv-unreserved / unreserved / escaped ); everything else is %HH.
_HVALUE_SAFE = "[]/?:+$" + "-_.!~*'()"


def replaces_value(call_id: str, *, local_tag: str, remote_tag: str) -> str:
    """The Replaces header (RFC 3891 §6.1) naming our dialog ``(call_id, local_tag, remote_tag)`` to its far end.

    §3: the receiver of the INVITE with Replaces matches to-tag against *its* local tag and from-tag against its
    remote tag. That receiver is the far end of our dialog, so to-tag is its tag (our remote tag) and from-tag
    ours (our local tag), whichever side sent the dialog's INVITE."""
    return f"{call_id};to-tag={remote_tag};from-tag={local_tag}"


def escape_header_value(value: str) -> str:
    """A header value as it may stand inside a SIP URI (``;`` -> %3B, ``=`` -> %3D, ``@`` -> %40, ...)."""
    return quote(value, safe=_HVALUE_SAFE)


def refer_to_replacing(remote_target: str, call_id: str, *, local_tag: str, remote_tag: str) -> str:
    """The Refer-To URI (without the angle brackets) that sends the referee to ``remote_target`` (the far end's
    Contact in our dialog) to replace that dialog; any headers the Contact carried are dropped."""
    uri = replace(parse_uri(remote_target), headers="")
    replaces = escape_header_value(replaces_value(call_id, local_tag=local_tag, remote_tag=remote_tag))
    return f"{uri}?Replaces={replaces}"


def offers_replaces(headers: Iterable[tuple[str, str]]) -> bool:
    """The request's Allow lists REFER and its Supported lists ``replaces``: the peer says it can be transferred
    with a REFER whose Refer-To carries a Replaces (a phone that did not say so may still; policy decides)."""
    allow: set[str] = set()
    supported: set[str] = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered == "allow":
            allow.update(token.strip().lower() for token in value.split(","))
        elif lowered in ("supported", "k"):
            supported.update(token.strip().lower() for token in value.split(","))
    return "refer" in allow and "replaces" in supported
