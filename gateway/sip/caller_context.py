"""Caller context: who is calling, whom they dialled, and the headers an application asked for.

Owns: `CallContext` (a frozen value built once per call from the initial INVITE, or from a browser's
token request), `ContextPolicy` (which headers to keep, which sources are trusted, the size caps), the
sanitising of every value that came from the peer, and the templates (`{caller_number}`,
`{headers.X-Account}`) that profiles write their instructions and greeting in.

Identity (RFC 3325 §9.1): a P-Asserted-Identity is only believed when it arrives from a source inside the
trust domain (`ContextPolicy.trusted_sources`, the trunk's addresses); from anyone else it is ignored, as
anybody can write one. From a trusted source the order is P-Asserted-Identity, then Remote-Party-ID (the
pre-standard draft many carriers still send), then From. From an untrusted source it is always From.
`identity_source` records which header won. A ``tel:`` PAI beside a ``sip:`` one is taken when it is the
only one with a number (§9.1 allows one of each).

Redirection: Diversion (RFC 5806) and History-Info (RFC 7044) name the numbers the call was forwarded
from, newest Diversion first / oldest History-Info first, as those RFCs order them.

Sanitising: peer values lose control characters (Unicode Cc, Cf, line and paragraph separators), runs of
whitespace become one space, and each value is capped at `max_value_chars`; at most `max_headers` kept
headers and `max_redirects` redirections are kept. Templates render every value as a JSON string (quoted,
escaped), so a header carrying "ignore previous instructions" stays one quoted value inside the text.

Sans-I/O: no clock, no sockets; the parsing helpers raise `RemoteProtocolError` with a precise reason,
and `context_from_invite` turns those into `problems` (the call goes on with what could be read).
"""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .errors import RemoteProtocolError
from .grammar import split_outside
from .uri import NameAddr, SipUri, parse_name_addr

IdentitySource = Literal["p-asserted-identity", "remote-party-id", "from", "page", "none"]

# Names a template may use besides headers.<Name> (configured) and metadata.<key> (a browser page's).
TEMPLATE_NAMES: tuple[str, ...] = (
    "caller_number",
    "caller_name",
    "called_number",
    "diverted_from",
    "call_id",
    "direction",
    "route",
    "transport",
    "source",
)

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!%*_+`'~.-]{1,64}$")  # RFC 3261 §25.1 token, bounded
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# A placeholder is {name}, {headers.Name} or {metadata.key}; other braces (JSON in instructions) stay text.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9!%*_+`'~.-]+)?)\}")
_DIALLABLE = re.compile(r"^\+?[0-9*#().-]+$")  # a phone number (visual separators of RFC 3966 allowed)
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


class ContextPolicyError(ValueError):
    """A context policy or a template is invalid (raised at configuration load, never per call)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextPolicy:
    """What a call's context keeps: the named headers, the trusted sources, the caps on peer values."""

    headers: tuple[str, ...] = ()
    trusted_sources: tuple[str, ...] = ()  # addresses or networks (CIDR) of trusted trunks
    max_value_chars: int = 256
    max_headers: int = 16
    max_redirects: int = 8

    def __post_init__(self) -> None:
        for name in self.headers:
            if not _HEADER_NAME.fullmatch(name):
                raise ContextPolicyError(f"not a SIP header name: {name!r}")
        lowered = [name.lower() for name in self.headers]
        if len(set(lowered)) != len(lowered):
            raise ContextPolicyError("a header is named twice (names are case-insensitive)")
        for source in self.trusted_sources:
            try:
                ipaddress.ip_network(source, strict=False)
            except ValueError:
                raise ContextPolicyError(f"not an address or network: {source!r}") from None
        if not 1 <= self.max_value_chars <= 4096:
            raise ContextPolicyError("max_value_chars must be within 1..4096")
        if not 0 <= self.max_headers <= 64:
            raise ContextPolicyError("max_headers must be within 0..64")
        if not 0 <= self.max_redirects <= 32:
            raise ContextPolicyError("max_redirects must be within 0..32")

    def trusts(self, host: str) -> bool:
        """True when ``host`` (the INVITE's source address) is inside the trust domain."""
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(net, strict=False) for net in self.trusted_sources)

    def header_named(self, name: str) -> str | None:
        """The configured spelling of ``name`` (case-insensitive), or None when it is not kept."""
        lowered = name.lower()
        return next((kept for kept in self.headers if kept.lower() == lowered), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallContext:
    """What is known about a call when it arrives; every peer-supplied value is already sanitised."""

    call_id: str = ""
    direction: str = "inbound"
    route: str = ""
    kind: Literal["sip", "webrtc"] = "sip"
    transport: str = ""  # udp, tcp, tls; webrtc for browser calls
    source: str = ""  # host:port the INVITE came from
    caller_number: str = ""
    caller_name: str = ""
    identity_source: IdentitySource = "none"
    privacy: bool = False  # the caller asked for Privacy: id (RFC 3323/3325)
    called_number: str = ""
    diverted_from: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()  # (configured name, value), in configuration order
    metadata: tuple[tuple[str, str], ...] = ()  # a browser page's, from its token request
    problems: tuple[str, ...] = field(default=(), compare=False)  # what could not be read, for the log

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for kept, value in self.headers if kept.lower() == lowered), None)

    def value_of(self, name: str) -> str:
        """The value of a template name ("" when the call did not carry it)."""
        if name.startswith("headers."):
            return self.header(name.removeprefix("headers.")) or ""
        if name.startswith("metadata."):
            return dict(self.metadata).get(name.removeprefix("metadata."), "")
        if name == "diverted_from":
            return self.diverted_from[0] if self.diverted_from else ""
        if name in TEMPLATE_NAMES:
            value = getattr(self, name)
            return value if isinstance(value, str) else ""
        raise KeyError(name)

    def as_parameters(self) -> dict[str, str]:
        """Flat text pairs for peers that take only strings (the websocket bot's customParameters). The first
        six keys are the ones that provider always sent; headers come as ``header.<Name>``."""
        parameters = {
            "from_number": self.caller_number,
            "to_number": self.called_number,
            "call_id": self.call_id,
            "direction": self.direction,
            "route": self.route,
            "transport": self.kind,
            "sip_transport": self.transport if self.kind == "sip" else "",
            "caller_name": self.caller_name,
            "identity_source": self.identity_source,
            "source": self.source,
            "diverted_from": ",".join(self.diverted_from),
        }
        parameters.update({f"header.{name}": value for name, value in self.headers})
        parameters.update({f"metadata.{key}": value for key, value in self.metadata})
        return parameters

    def as_json(self) -> dict[str, object]:
        """The JSON form sent to webhooks and shown by the API."""
        return {
            "caller_number": self.caller_number,
            "caller_name": self.caller_name,
            "identity_source": self.identity_source,
            "privacy": self.privacy,
            "called_number": self.called_number,
            "diverted_from": list(self.diverted_from),
            "headers": dict(self.headers),
            "metadata": dict(self.metadata),
            "transport": self.transport,
            "source": self.source,
            "direction": self.direction,
            "route": self.route,
            "call_id": self.call_id,
        }


# ------------------------------------------------------------------------------------------ sanitising


def sanitise(value: str, *, limit: int) -> str:
    """``value`` without control or format characters, whitespace runs as one space, at most ``limit`` chars."""
    kept = "".join(
        " " if char.isspace() else char
        for char in value
        if unicodedata.category(char) not in _DROPPED_CATEGORIES or char in "\t\n\r"
    )
    return " ".join(kept.split())[:limit].strip()


# ------------------------------------------------------------------------------------------ identities


def number_of(uri: SipUri) -> str:
    """The number (or user) of a URI: the user part of sip:/sips:, the number of tel: (params dropped)."""
    if uri.scheme == "tel" or uri.is_sip:
        return (uri.user or "").split(";", 1)[0]
    return ""


def parse_identity(text: str, *, header: str) -> NameAddr:
    """One name-addr of an identity header, with a precise error naming the header when it is unreadable."""
    try:
        address = parse_name_addr(text)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"{header}: {exc.reason}") from None
    if address.uri.scheme not in ("sip", "sips", "tel"):
        raise RemoteProtocolError(f"{header}: scheme {address.uri.scheme!r} names no caller")
    return address


def asserted_identity(values: Iterable[str]) -> NameAddr | None:
    """The P-Asserted-Identity to use: the first with a number; RFC 3325 allows one sip: and one tel:."""
    addresses = [parse_identity(value, header="P-Asserted-Identity") for value in values]
    if len(addresses) > 2:
        raise RemoteProtocolError("P-Asserted-Identity: more than two identities (RFC 3325 §9.1 allows two)")
    with_number = [address for address in addresses if _DIALLABLE.fullmatch(number_of(address.uri))]
    return with_number[0] if with_number else (addresses[0] if addresses else None)


def redirections(diversion: Iterable[str], history_info: Iterable[str]) -> list[str]:
    """The numbers a call was diverted from: Diversion entries (newest first), then History-Info (by index)."""
    numbers: list[str] = []
    for value in diversion:
        number = number_of(parse_identity(value, header="Diversion").uri)
        if number:
            numbers.append(number)
    for value in history_info:
        number = number_of(parse_identity(value, header="History-Info").uri)
        if number:
            numbers.append(number)
    return numbers


def _values(headers: Iterable[tuple[str, str]], name: str) -> list[str]:
    """Every comma-separated value of ``name`` (a list header, §7.3.1), across its header lines."""
    lowered = name.lower()
    values: list[str] = []
    for header, value in headers:
        if header.lower() == lowered:
            try:
                parts = split_outside(value, ",")
            except RemoteProtocolError as exc:
                raise RemoteProtocolError(f"{name}: {exc.reason}") from None
            values += [part.strip() for part in parts if part.strip()]
    return values


def _first_line(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    lowered = name.lower()
    return next((value for header, value in headers if header.lower() == lowered), None)


def context_from_invite(
    *,
    request_uri: str,
    from_header: str,
    from_display_name: str | None,
    to_uri: str,
    headers: Iterable[tuple[str, str]],
    source: tuple[str, int],
    transport: str,
    policy: ContextPolicy,
    call_id: str = "",
    route: str = "",
) -> CallContext:
    """The context of an inbound call from its INVITE. Never raises for a peer's input: an unreadable
    identity or redirection header is skipped and named in ``problems``."""
    headers = tuple(headers)
    limit = policy.max_value_chars
    problems: list[str] = []

    def clean(text: str | None) -> str:
        return sanitise(text or "", limit=limit)

    caller: NameAddr | None = None
    identity: IdentitySource = "none"
    trusted = policy.trusts(source[0])
    if trusted:
        readers: tuple[tuple[IdentitySource, Callable[[], NameAddr | None]], ...] = (
            ("p-asserted-identity", lambda: asserted_identity(_values(headers, "P-Asserted-Identity"))),
            ("remote-party-id", lambda: _remote_party_id(headers)),
        )
        for name, read in readers:
            try:
                caller = read()
            except RemoteProtocolError as exc:
                problems.append(exc.reason)
                continue
            if caller is not None:
                identity = name
                break
    elif _first_line(headers, "P-Asserted-Identity") is not None:
        problems.append(f"P-Asserted-Identity from untrusted {source[0]} ignored (RFC 3325 §9.1)")
    display = from_display_name
    if caller is None:
        try:
            caller = parse_identity(from_header, header="From")
            identity = "from"
        except RemoteProtocolError as exc:
            problems.append(exc.reason)
    elif caller.display_name:
        display = caller.display_name
    try:
        privacy = "id" in {part.strip().lower() for value in _values(headers, "Privacy") for part in value.split(";")}
    except RemoteProtocolError as exc:
        problems.append(exc.reason)
        privacy = False

    try:
        called = number_of(parse_identity(request_uri, header="Request-URI").uri)
    except RemoteProtocolError:
        called = ""
    if not called:
        try:
            called = number_of(parse_identity(to_uri, header="To").uri)
        except RemoteProtocolError as exc:
            problems.append(exc.reason)
    try:
        diverted = redirections(_values(headers, "Diversion"), _values(headers, "History-Info"))
    except RemoteProtocolError as exc:
        problems.append(exc.reason)
        diverted = []

    kept: list[tuple[str, str]] = []
    for kept_name in policy.headers[: policy.max_headers]:
        value = _first_line(headers, kept_name)
        if value is not None:
            kept.append((kept_name, clean(value)))
    return CallContext(
        call_id=call_id,
        direction="inbound",
        route=route,
        kind="sip",
        transport=transport,
        source=f"{source[0]}:{source[1]}",
        caller_number=clean(number_of(caller.uri)) if caller is not None else "",
        caller_name=clean(display),
        identity_source=identity,
        privacy=privacy,
        called_number=clean(called),
        diverted_from=tuple(clean(number) for number in diverted[: policy.max_redirects]),
        headers=tuple(kept),
        problems=tuple(problems),
    )


def _remote_party_id(headers: Iterable[tuple[str, str]]) -> NameAddr | None:
    """The calling party of Remote-Party-ID (draft-ietf-sip-privacy-04): the entry with party=calling, or
    the first entry without a party parameter."""
    for value in _values(headers, "Remote-Party-ID"):
        address = parse_identity(value, header="Remote-Party-ID")
        if address.param("party") in (None, "calling"):
            return address
    return None


def context_of_page(
    *, metadata: Mapping[str, object], policy: ContextPolicy, call_id: str = "", route: str = "", source: str = ""
) -> CallContext:
    """The context of a browser call: the metadata its page passed with the token request, sanitised."""
    pairs: list[tuple[str, str]] = []
    for key, value in list(metadata.items())[: policy.max_headers]:
        if _METADATA_KEY.fullmatch(key) and isinstance(value, str | int | float | bool):
            pairs.append((key, sanitise(str(value), limit=policy.max_value_chars)))
    return CallContext(
        call_id=call_id,
        route=route,
        kind="webrtc",
        transport="webrtc",
        source=source,
        identity_source="page" if pairs else "none",
        metadata=tuple(pairs),
    )


# ------------------------------------------------------------------------------------------ templates


def template_names(template: str) -> list[str]:
    """The placeholder names ``template`` uses, in order (``{{`` and ``}}`` are literal braces)."""
    return [match.group(1) for match in _PLACEHOLDER.finditer(_unescaped(template))]


def template_problems(template: str, policy: ContextPolicy) -> list[str]:
    """Why ``template`` cannot be rendered for any call under ``policy`` (empty: it can)."""
    problems: list[str] = []
    for name in template_names(template):
        if name.startswith("headers."):
            header = name.removeprefix("headers.")
            if policy.header_named(header) is None:
                kept = ", ".join(policy.headers) or "none configured"
                problems.append(f"{{{name}}}: header {header!r} is not in context.headers (kept: {kept})")
        elif name.startswith("metadata."):
            if not _METADATA_KEY.fullmatch(name.removeprefix("metadata.")):
                problems.append(f"{{{name}}}: not a metadata key")
        elif name not in TEMPLATE_NAMES:
            problems.append(f"{{{name}}}: unknown name (known: {', '.join(TEMPLATE_NAMES)}, headers.*, metadata.*)")
    return problems


def render(template: str, context: CallContext) -> str:
    """``template`` with each placeholder replaced by its value as a JSON string (quoted and escaped).

    The template was checked at load time (`template_problems`); a name still unknown here renders as
    an empty string rather than failing a call that is already ringing."""

    def value(match: re.Match[str]) -> str:
        try:
            text = context.value_of(match.group(1))
        except KeyError:
            text = ""
        return json.dumps(text, ensure_ascii=False)

    parts = template.split("{{")
    rendered = [_PLACEHOLDER.sub(value, part.replace("}}", "\x00")) for part in parts]
    return "{".join(rendered).replace("\x00", "}")


def _unescaped(template: str) -> str:
    return template.replace("{{", "\x00").replace("}}", "\x00")
