"""SIP messages: parse and serialize (RFC 3261 §7, §18.3 framing, §8.2 request checks, §8.2.6 responses).

Owns: `SipRequest` / `SipResponse`, `parse_message` (start line, header folding §7.3.1, compact forms,
Content-Length truncation for datagrams §18.3, `SipLimits`), `validate_request` (the §8.2 checks that have
a status code of their own), `make_response` (copies Via/From/To/Call-ID/CSeq verbatim) and `encode`,
which always writes a correct Content-Length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import MalformedMessageError, MessageTooLargeError, RemoteProtocolError
from .headers import BRANCH_MAGIC, CSeq, Headers, Via, parse_cseq, parse_int_header, parse_via
from .uri import NameAddr, SipUri, parse_name_addr, parse_uri

SIP_VERSION = "SIP/2.0"

REASON_PHRASES: dict[int, str] = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    183: "Session Progress",
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    421: "Extension Required",
    422: "Session Interval Too Small",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    513: "Message Too Large",
    603: "Decline",
}


def reason_phrase(status: int) -> str:
    return REASON_PHRASES.get(status, "Unknown")


@dataclass(frozen=True, kw_only=True)
class SipLimits:
    """Size limits applied before any other parsing; exceeding one is a `MessageTooLargeError`."""

    max_message_bytes: int = 65_535
    max_header_section_bytes: int = 16_384
    max_headers: int = 128
    max_body_bytes: int = 49_152


@dataclass(kw_only=True)
class _MessageBase:
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""
    version: str = SIP_VERSION

    # Typed views, parsed on access: a message is read a few times at most.
    @property
    def call_id(self) -> str:
        return self._required("Call-ID")

    @property
    def cseq(self) -> CSeq:
        return parse_cseq(self._required("CSeq"))

    @property
    def from_(self) -> NameAddr:
        return parse_name_addr(self._required("From"))

    @property
    def to(self) -> NameAddr:
        return parse_name_addr(self._required("To"))

    @property
    def vias(self) -> list[Via]:
        return [parse_via(value) for value in self.headers.values("Via")]

    @property
    def top_via(self) -> Via:
        values = self.headers.values("Via")
        if not values:
            raise RemoteProtocolError("missing Via")
        return parse_via(values[0])

    @property
    def contacts(self) -> list[NameAddr]:
        return [parse_name_addr(value) for value in self.headers.values("Contact") if value != "*"]

    @property
    def content_type(self) -> str | None:
        value = self.headers.get("Content-Type")
        return value.split(";")[0].strip().lower() if value else None

    def _required(self, name: str) -> str:
        value = self.headers.get(name)
        if value is None or not value:
            raise RemoteProtocolError(f"missing {name}")
        return value

    def _encode(self, start_line: str) -> bytes:
        lines = [start_line]
        lines.extend(f"{name}: {value}" for name, value in self.headers if name != "Content-Length")
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


@dataclass(kw_only=True)
class SipRequest(_MessageBase):
    method: str
    uri: SipUri

    def encode(self) -> bytes:
        return self._encode(f"{self.method} {self.uri} {self.version}")


@dataclass(kw_only=True)
class SipResponse(_MessageBase):
    status: int
    reason: str = ""

    def encode(self) -> bytes:
        return self._encode(f"{self.version} {self.status} {self.reason or reason_phrase(self.status)}")


SipMessage = SipRequest | SipResponse

_VERSION_RE = re.compile(r"^SIP/(\d+)\.(\d+)$", re.IGNORECASE)
_METHOD_RE = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        return data[:end], data[end + 4 :]
    # Lenient: bare-LF line endings are seen from broken stacks; accept them, never produce them.
    end = data.find(b"\n\n")
    if end >= 0:
        return data[:end], data[end + 2 :]
    return data, b""


def _check_version(version: str) -> None:
    match = _VERSION_RE.match(version)
    if match is None:
        raise RemoteProtocolError(f"bad SIP version {version[:20]!r}")
    if version.upper() != SIP_VERSION:
        raise RemoteProtocolError(f"unsupported SIP version {version[:20]!r}", status_code=505)


def _parse_start_line(line: str) -> tuple[SipMessage, RemoteProtocolError | None]:
    """The message shell, and a version error to raise once the headers are parsed (so 505 can be sent)."""
    if line.upper().startswith("SIP/"):
        parts = line.split(None, 2)
        if len(parts) < 2 or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) != 3:
            raise RemoteProtocolError(f"bad status line {line[:60]!r}")
        _check_version(parts[0])
        status = int(parts[1])
        if not 100 <= status <= 699:
            raise RemoteProtocolError(f"status code out of range: {status}")
        return SipResponse(status=status, reason=parts[2].strip() if len(parts) > 2 else ""), None
    parts = line.split()
    if len(parts) != 3:
        raise RemoteProtocolError(f"bad request line {line[:60]!r}")
    method, uri_text, version = parts
    if not _METHOD_RE.match(method):
        raise RemoteProtocolError(f"bad method {method[:20]!r}")
    uri = parse_uri(uri_text, allow_other_schemes=True)
    try:
        _check_version(version)
    except RemoteProtocolError as exc:
        return SipRequest(method=method, uri=uri), exc
    return SipRequest(method=method, uri=uri), None


def _header_lines(head: str) -> list[str]:
    """Unfold continuation lines (§7.3.1: a line starting with SP/HT continues the previous one)."""
    lines: list[str] = []
    for raw in re.split(r"\r?\n", head):
        if raw[:1] in (" ", "\t") and lines:
            lines[-1] = lines[-1].rstrip() + " " + raw.strip()
        else:
            lines.append(raw)
    return lines


def parse_message(data: bytes, *, limits: SipLimits | None = None, framed: bool = False) -> SipMessage:
    """Parse one whole message. `framed=True` means a stream framer already cut the body to Content-Length.

    Raises `RemoteProtocolError` (or its subclasses) with the status to answer; `MalformedMessageError`
    carries the part that parsed so a 400 can still be built.
    """
    limits = limits or SipLimits()
    if len(data) > limits.max_message_bytes:
        raise MessageTooLargeError(f"message of {len(data)} bytes")
    data = data.lstrip(b"\r\n")  # §7.5: CRLFs before the start line are ignored
    head_bytes, body = _split_head(data)
    if len(head_bytes) > limits.max_header_section_bytes:
        raise MessageTooLargeError("header section too large")
    try:
        head = head_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError("header section is not UTF-8") from exc
    lines = _header_lines(head)
    if not lines or not lines[0].strip():
        raise RemoteProtocolError("empty message")
    message, version_error = _parse_start_line(lines[0].strip())
    if len(lines) - 1 > limits.max_headers:
        raise MalformedMessageError("too many header lines", partial=None, status_code=513)
    problem: str | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not name:
            problem = problem or f"bad header line {line[:40]!r}"
            continue
        try:
            message.headers.add(name, value)
        except RemoteProtocolError as exc:
            problem = problem or exc.reason
    if version_error is not None:
        raise MalformedMessageError(version_error.reason, partial=message, status_code=version_error.status_code)
    if problem is not None:
        raise MalformedMessageError(problem, partial=message)
    length_text = message.headers.get("Content-Length")
    if length_text is not None and any(
        v.strip() != length_text.strip() for v in message.headers.lines("Content-Length")
    ):
        # RFC 4475 §3.1.2.11 (mcl01): with two lengths nobody can know where the body ends.
        raise MalformedMessageError("conflicting Content-Length values", partial=message)
    if length_text is not None:
        try:
            length = parse_int_header(length_text, "Content-Length")
        except RemoteProtocolError as exc:
            raise MalformedMessageError(exc.reason, partial=message) from exc
        if length > limits.max_body_bytes:
            raise MessageTooLargeError(f"body of {length} bytes")
        if len(body) < length:
            message.body = body
            raise MalformedMessageError("body shorter than Content-Length", partial=message)
        body = body[:length]  # §18.3: bytes beyond Content-Length in a datagram are discarded
    elif framed:
        body = b""
    if len(body) > limits.max_body_bytes:
        raise MessageTooLargeError(f"body of {len(body)} bytes")
    message.body = body
    return message


_REQUIRED_REQUEST_HEADERS = ("Via", "From", "To", "Call-ID", "CSeq")


def validate_request(request: SipRequest) -> None:
    """The §8.2 checks with a precise status: missing/garbled headers and CSeq method mismatch -> 400."""
    for name in _REQUIRED_REQUEST_HEADERS:
        if not request.headers.get(name):
            raise RemoteProtocolError(f"Missing {name}")
    try:
        vias = request.vias
        request.from_  # noqa: B018 — parsed for validation only
        request.to  # noqa: B018
        cseq = request.cseq
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(exc.reason) from exc
    if not vias:
        raise RemoteProtocolError("Missing Via")
    if cseq.method != request.method:
        raise RemoteProtocolError("CSeq method does not match request method")
    max_forwards = request.headers.get("Max-Forwards")
    if max_forwards is not None:
        parse_int_header(max_forwards, "Max-Forwards")


def is_rfc3261(request: SipRequest) -> bool:
    """Whether the request comes from an RFC 3261 element: its top Via branch starts with the magic cookie
    (§8.1.1.7). Requests from RFC 2543 elements lack it, and may lack Contact, Max-Forwards and tags too."""
    try:
        branch = request.top_via.branch
    except RemoteProtocolError:
        return False
    return branch is not None and branch.startswith(BRANCH_MAGIC)


def can_answer(request: SipRequest) -> bool:
    """Whether a response can be built and routed: the top Via parses (§8.2.6.2, §18.2.2).

    The other headers a response copies are copied when present; the peer matches its transaction by
    the Via branch and CSeq, so a 400 for a request without Call-ID or From still reaches it."""
    try:
        request.top_via  # noqa: B018
    except RemoteProtocolError:
        return False
    return True


def make_response(
    request: SipRequest,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
) -> SipResponse:
    """A response copying Via, From, Call-ID, CSeq verbatim and To with `to_tag` added if it has none."""
    response = SipResponse(status=status, reason=reason or reason_phrase(status), body=body)
    for via in request.headers.lines("Via"):
        response.headers.add("Via", via)
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = request.headers.get(name)
        if value is None:
            continue
        if name == "To" and to_tag and status > 100:
            try:
                has_tag = request.to.tag is not None
            except RemoteProtocolError:
                has_tag = True  # never modify a To we cannot read
            if not has_tag:
                value = f"{value};tag={to_tag}"
        response.headers.add(name, value)
    for name, value in headers:
        response.headers.add(name, value)
    return response
