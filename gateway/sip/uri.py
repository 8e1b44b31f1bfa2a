"""SIP, SIPS and TEL URIs (RFC 3261 §19.1, RFC 3966) and name-addr / addr-spec values (§20.10, §25.1).

Owns: `SipUri` (parse + serialize, parameters and headers kept in order, user part kept escaped as
received), `NameAddr` (display name, URI, header parameters such as `tag`). URIs with other schemes are
kept opaque where RFC 3261 allows any absolute URI (From/To/Contact); as a Request-URI they earn 416.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from .errors import RemoteProtocolError
from .grammar import Params, find_closing_quote, format_params, get_param, is_token, parse_params, quote, unquote

SUPPORTED_SCHEMES = ("sip", "sips", "tel")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789+-.")


@dataclass(frozen=True, kw_only=True)
class SipUri:
    """A parsed URI. For `tel:` the number is in `user` and `host` is empty; other schemes keep `opaque`."""

    scheme: str = "sip"
    user: str | None = None
    password: str | None = None
    host: str = ""
    port: int | None = None
    params: Params = ()
    headers: str = ""
    opaque: str = ""

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")

    def param(self, name: str) -> str | None:
        return get_param(self.params, name)

    @property
    def transport(self) -> str:
        """Lower-cased transport parameter; a sips URI means TLS (RFC 5630 §3.2: over TCP, whatever
        ``transport=`` says), and a sip URI without the parameter means UDP (RFC 3263 §4.1)."""
        if self.scheme == "sips":
            return "tls"
        value = self.param("transport")
        return value.lower() if value else "udp"

    @property
    def names_transport(self) -> bool:
        """True when the URI itself chooses the transport (sips, or a transport parameter)."""
        return self.scheme == "sips" or self.param("transport") is not None

    @property
    def secure(self) -> bool:
        """sips, or sip with ``transport=tls`` (the RFC 3261 form RFC 5630 deprecates but peers still send)."""
        return self.transport == "tls"

    def host_port(self, default_port: int | None = None) -> tuple[str, int]:
        """Host (IPv6 without brackets) and port, defaulting per §19.1.2 (5061 for TLS, RFC 3263 §4.2)."""
        host = self.host[1:-1] if self.host.startswith("[") else self.host
        if self.port is not None:
            return host, self.port
        if default_port is None:
            default_port = 5061 if self.secure else 5060
        return host, default_port

    def with_params(self, params: Params) -> SipUri:
        return replace(self, params=params)

    def __str__(self) -> str:
        if self.opaque:
            return f"{self.scheme}:{self.opaque}"
        if self.scheme == "tel":
            return f"tel:{self.user or ''}{format_params(self.params)}"
        out = [self.scheme, ":"]
        if self.user is not None:
            out.append(self.user)
            if self.password is not None:
                out.append(":" + self.password)
            out.append("@")
        out.append(self.host)
        if self.port is not None:
            out.append(f":{self.port}")
        out.append(format_params(self.params))
        if self.headers:
            out.append("?" + self.headers)
        return "".join(out)


def format_host(host: str) -> str:
    """A host as it appears in a URI or Via: IPv6 addresses get brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def parse_host_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise RemoteProtocolError("unterminated IPv6 reference")
        host, rest = text[: close + 1], text[close + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError as exc:
            raise RemoteProtocolError(f"bad IPv6 reference {host[:60]!r}") from exc
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        if not host or not all(ch in _HOST_CHARS for ch in host):
            raise RemoteProtocolError(f"bad host {host[:60]!r}")
    if not rest:
        return host, None
    if not rest.startswith(":") or not (rest[1:].isascii() and rest[1:].isdigit()) or len(rest) > 6:
        raise RemoteProtocolError(f"bad port {rest[:10]!r}")
    port = int(rest[1:])
    if port > 65535:
        raise RemoteProtocolError(f"port out of range: {port}")
    return host, port


def parse_uri(text: str, *, allow_other_schemes: bool = False) -> SipUri:
    """Parse a URI; an unsupported scheme raises 416 unless `allow_other_schemes` keeps it opaque."""
    text = text.strip()
    scheme, colon, rest = text.partition(":")
    scheme = scheme.lower()
    if not colon or not scheme or not scheme[0].isalpha() or not all(ch in _SCHEME_CHARS for ch in scheme):
        raise RemoteProtocolError(f"bad URI {text[:60]!r}")
    if any(ch in text for ch in ' \t\r\n<>"'):
        raise RemoteProtocolError(f"bad character in URI {text[:60]!r}")
    if scheme not in SUPPORTED_SCHEMES:
        if allow_other_schemes and rest:
            return SipUri(scheme=scheme, opaque=rest)
        raise RemoteProtocolError(f"unsupported URI scheme {scheme!r}", status_code=416)
    if scheme == "tel":
        number, _, param_text = rest.partition(";")
        if not number:
            raise RemoteProtocolError("empty tel number")
        return SipUri(scheme="tel", user=number, params=parse_params(param_text))
    rest, _, headers = rest.partition("?")
    user: str | None = None
    password: str | None = None
    at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, pw = userinfo.partition(":")
        password = pw if colon else None
        if not user:
            raise RemoteProtocolError("empty user part")
    host_text, _, param_text = rest.partition(";")
    host, port = parse_host_port(host_text)
    return SipUri(
        scheme=scheme,
        user=user,
        password=password,
        host=host,
        port=port,
        params=parse_params(param_text),
        headers=headers,
    )


@dataclass(frozen=True, kw_only=True)
class NameAddr:
    """`"Display" <uri>;param=value` — the value of From, To, Contact, Route, Record-Route, Refer-To."""

    uri: SipUri
    display_name: str | None = None
    params: Params = ()

    @property
    def tag(self) -> str | None:
        return get_param(self.params, "tag")

    def param(self, name: str) -> str | None:
        return get_param(self.params, name)

    def with_params(self, params: Params) -> NameAddr:
        return replace(self, params=params)

    def __str__(self) -> str:
        display = ""
        if self.display_name:
            name = self.display_name
            simple = all(is_token(word) for word in name.split(" ")) and "  " not in name
            display = (name if simple else quote(name)) + " "
        return f"{display}<{self.uri}>{format_params(self.params)}"


def parse_name_addr(text: str) -> NameAddr:
    """Parse name-addr (`Name <uri>;p`) or addr-spec (`uri;p`, where `;p` are header parameters, §20)."""
    text = text.strip()
    if not text:
        raise RemoteProtocolError("empty address")
    display: str | None = None
    if text.startswith('"'):
        close = find_closing_quote(text, 0)
        display = unquote(text[: close + 1])
        text = text[close + 1 :].lstrip()
        if not text.startswith("<"):
            raise RemoteProtocolError("display name without <uri>")
    lt = text.find("<")
    if lt >= 0:
        if display is None:
            display = text[:lt].strip() or None
        gt = text.find(">", lt)
        if gt < 0:
            raise RemoteProtocolError("missing '>' in address")
        uri = parse_uri(text[lt + 1 : gt], allow_other_schemes=True)
        return NameAddr(uri=uri, display_name=display, params=parse_params(text[gt + 1 :]))
    # addr-spec: a URI with no brackets may not carry ',', '?' or ';' of its own (§20.10).
    uri_text, _, param_text = text.partition(";")
    return NameAddr(uri=parse_uri(uri_text, allow_other_schemes=True), params=parse_params(param_text))
