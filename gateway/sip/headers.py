"""SIP header fields (RFC 3261 §7.3, §20): names, compact forms, multi-valued lists, Via and CSeq.

Owns: `Headers`, an ordered, case-insensitive multi-map that keeps every header line as received (so a
response can copy From/To/Call-ID/CSeq/Via verbatim, §8.2.6.2) and expands compact forms (§7.3.3) to
their canonical names; the comma-list split of §7.3.1 for headers whose grammar is a list; and the typed
values `Via` (§20.42, with branch/received/rport of RFC 3581) and `CSeq` (§20.16).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from .errors import RemoteProtocolError
from .grammar import (
    Params,
    format_params,
    get_param,
    has_param,
    is_token,
    parse_params,
    quote,
    split_outside,
    with_param,
)
from .uri import format_host, parse_host_port

# §7.3.3 and the registries of RFC 3515 (r, b), RFC 3265 (o, u), RFC 4028 (x), RFC 3841 (a, j, d).
COMPACT_FORMS: dict[str, str] = {
    "i": "call-id",
    "m": "contact",
    "e": "content-encoding",
    "l": "content-length",
    "c": "content-type",
    "f": "from",
    "s": "subject",
    "k": "supported",
    "t": "to",
    "v": "via",
    "r": "refer-to",
    "b": "referred-by",
    "o": "event",
    "u": "allow-events",
    "x": "session-expires",
    "a": "accept-contact",
    "j": "reject-contact",
    "d": "request-disposition",
}

_CANONICAL: dict[str, str] = {
    "call-id": "Call-ID",
    "cseq": "CSeq",
    "www-authenticate": "WWW-Authenticate",
    "min-se": "Min-SE",
    "rseq": "RSeq",
    "rack": "RAck",
    "mime-version": "MIME-Version",
}

# Headers whose grammar is a comma-separated list (§7.3.1); others (auth, Date, ...) contain commas.
LIST_HEADERS = frozenset(
    {
        "via",
        "contact",
        "route",
        "record-route",
        "allow",
        "supported",
        "require",
        "proxy-require",
        "unsupported",
        "accept",
        "accept-encoding",
        "accept-language",
        "allow-events",
        "content-encoding",
        "in-reply-to",
    }
)


def canonical_name(name: str) -> str:
    """`call-id` -> `Call-ID`, `v` -> `Via`, `x-foo` -> `X-Foo`."""
    lower = name.lower()
    lower = COMPACT_FORMS.get(lower, lower)
    return _CANONICAL.get(lower) or "-".join(part[:1].upper() + part[1:] for part in lower.split("-"))


class Headers:
    """Header lines in order; lookup is case-insensitive and compact forms are expanded on insert."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items:
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        if not is_token(name):
            raise RemoteProtocolError(f"bad header name {name[:40]!r}")
        self._items.append((canonical_name(name), value.strip()))

    def prepend(self, name: str, value: str) -> None:
        self._items.insert(0, (canonical_name(name), value.strip()))

    def set(self, name: str, value: str) -> None:
        """Replace every line of `name` by one line, at the position of the first."""
        canonical = canonical_name(name)
        for index, (key, _) in enumerate(self._items):
            if key == canonical:
                self._items[index] = (canonical, value.strip())
                self._items = [item for i, item in enumerate(self._items) if i == index or item[0] != canonical]
                return
        self._items.append((canonical, value.strip()))

    def remove(self, name: str) -> None:
        canonical = canonical_name(name)
        self._items = [item for item in self._items if item[0] != canonical]

    def get(self, name: str) -> str | None:
        """The first line's value, or None."""
        canonical = canonical_name(name)
        for key, value in self._items:
            if key == canonical:
                return value
        return None

    def lines(self, name: str) -> list[str]:
        canonical = canonical_name(name)
        return [value for key, value in self._items if key == canonical]

    def values(self, name: str) -> list[str]:
        """All values of `name` over repeated lines, split on commas for list headers (§7.3.1)."""
        out: list[str] = []
        split = canonical_name(name).lower() in LIST_HEADERS
        for line in self.lines(name):
            out.extend(part for part in (split_outside(line, ",") if split else [line]) if part)
        return out

    def tokens(self, name: str) -> frozenset[str]:
        """Lower-cased option tags / methods of a list header (Require, Supported, Allow)."""
        return frozenset(value.lower() for value in self.values(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def copy(self) -> Headers:
        clone = Headers()
        clone._items = list(self._items)
        return clone

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


_VIA_RE = re.compile(r"^SIP\s*/\s*2\.0\s*/\s*([A-Za-z0-9-]+)\s+(\S[^;]*?)\s*(;.*)?$", re.IGNORECASE | re.DOTALL)
BRANCH_MAGIC = "z9hG4bK"


@dataclass(frozen=True, kw_only=True)
class Via:
    """One Via value: `SIP/2.0/UDP host:port;branch=z9hG4bK...;rport;received=...`."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()

    @property
    def branch(self) -> str | None:
        return get_param(self.params, "branch")

    @property
    def received(self) -> str | None:
        return get_param(self.params, "received")

    @property
    def has_rport(self) -> bool:
        return has_param(self.params, "rport")

    @property
    def rport(self) -> int | None:
        value = get_param(self.params, "rport")
        return int(value) if value and (value.isascii() and value.isdigit()) else None

    def with_param(self, name: str, value: str | None) -> Via:
        return replace(self, params=with_param(self.params, name, value))

    @property
    def sent_by(self) -> tuple[str, int]:
        host = self.host[1:-1] if self.host.startswith("[") else self.host
        return host.lower(), self.port if self.port is not None else 5060

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"SIP/2.0/{self.transport.upper()} {format_host(self.host)}{port}{format_params(self.params)}"


def parse_via(text: str) -> Via:
    match = _VIA_RE.match(text.strip())
    if match is None:
        raise RemoteProtocolError(f"bad Via {text[:80]!r}")
    transport, sent_by, param_text = match.group(1), match.group(2).strip(), match.group(3) or ""
    sent_by = re.sub(r"\s*:\s*", ":", sent_by) if not sent_by.startswith("[") else sent_by
    host, port = parse_host_port(sent_by)
    params = parse_params(param_text)
    rport = get_param(params, "rport")
    if rport is not None and not ((rport.isascii() and rport.isdigit()) and int(rport) <= 65535):
        raise RemoteProtocolError("bad rport")
    return Via(transport=transport.upper(), host=host, port=port, params=params)


MAX_CSEQ = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class CSeq:
    number: int
    method: str

    def __str__(self) -> str:
        return f"{self.number} {self.method}"


def parse_cseq(text: str) -> CSeq:
    parts = text.split()
    if len(parts) != 2 or not (parts[0].isascii() and parts[0].isdigit()) or not is_token(parts[1]):
        raise RemoteProtocolError(f"bad CSeq {text[:40]!r}")
    number = int(parts[0])
    if number > MAX_CSEQ:
        raise RemoteProtocolError("CSeq number out of range")
    return CSeq(number=number, method=parts[1])


def parse_int_header(text: str, name: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 10:
        raise RemoteProtocolError(f"bad {name} {text[:20]!r}")
    return int(value)


def reason_value(text: str, *, protocol: str = "Q.850", cause: int = 16) -> str:
    """An RFC 3326 Reason value, ``Q.850;cause=16;text="..."`` (cause 16: normal call clearing). The text is
    made safe for a quoted string: control characters become spaces, and it is cut to 128 characters."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)[:128]
    return f"{protocol};cause={cause};text={quote(clean)}"
