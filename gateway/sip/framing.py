"""Stream framing for SIP over TCP (RFC 3261 §18.3, §7.5; keepalives of RFC 5626 §3.5.1).

Owns: `StreamFramer`, which turns an arbitrary chunking of a byte stream into whole messages. A message
ends after its header section (CRLFCRLF) plus Content-Length bytes of body; Content-Length is mandatory on
streams, and a message without one is taken as having no body. CRLFs between messages (keepalive pings)
are skipped. A header section or body beyond `SipLimits` makes the stream unusable: `feed` raises
`MessageTooLargeError` and the glue should close the connection. So does a message whose end cannot be known:
a Content-Length that is not a number, or two that differ (RFC 4475 §3.1.2.11 over a stream), raise
`UnframeableStreamError`.
"""

from __future__ import annotations

import re

from .errors import MessageTooLargeError, UnframeableStreamError
from .message import SipLimits

_LENGTH_RE = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*(.*?)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)


class StreamFramer:
    """Feed bytes, get complete raw messages (to pass to the endpoint with transport='tcp')."""

    def __init__(self, limits: SipLimits | None = None) -> None:
        self._limits = limits or SipLimits()
        self._buffer = bytearray()
        self.keepalives = 0  # CRLF lines seen between messages (RFC 5626 pings and pongs)

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer.extend(data)
        messages: list[bytes] = []
        while True:
            message = self._next()
            if message is None:
                return messages
            messages.append(message)

    def _next(self) -> bytes | None:
        buffer = self._buffer
        skipped = 0
        while skipped < len(buffer) and buffer[skipped] in b"\r\n":
            skipped += 1
        if skipped:
            self.keepalives += buffer[:skipped].count(b"\n")  # one per CRLF line, however it was chunked
            del buffer[:skipped]
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > self._limits.max_header_section_bytes:
                raise MessageTooLargeError("header section too large on stream")
            return None
        head_end = end + 4
        if head_end > self._limits.max_header_section_bytes:
            raise MessageTooLargeError("header section too large on stream")
        head = bytes(buffer[:end])
        # Folded Content-Length lines are not worth supporting here: the parser rejects a mismatch later.
        values = set(_LENGTH_RE.findall(head))
        if len(values) > 1:
            raise UnframeableStreamError("two different Content-Length values on a stream")
        digits = values.pop() if values else b"0"
        if not digits.isdigit():
            raise UnframeableStreamError(f"Content-Length {digits[:20]!r} is not a number")
        if len(digits) > 10:  # int() of an unbounded digit string is itself a denial of service
            raise MessageTooLargeError(f"Content-Length of {len(digits)} digits on stream")
        length = int(digits)
        if length > self._limits.max_body_bytes:
            raise MessageTooLargeError(f"body of {length} bytes on stream")
        if len(buffer) < head_end + length:
            return None
        message = bytes(buffer[: head_end + length])
        del buffer[: head_end + length]
        return message

    @property
    def buffered(self) -> int:
        return len(self._buffer)
