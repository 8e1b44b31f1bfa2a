"""The SIP core's error tree, drawn once.

::

    SipError                         base of everything the SIP package raises
    ├── RemoteProtocolError          the peer sent something we cannot accept; carries the status code
    │   │                            (400, 413, 416, 420, 482, 501, 505, ...) to answer when a response
    │   │                            can be built, the reason phrase, and extra headers for that answer
    │   ├── MalformedMessageError    a header line or the body framing was broken; carries the best-effort
    │   │                            `partial` message so the endpoint can still answer 400 if it can
    │   ├── MessageTooLargeError     a limit from `SipLimits` was exceeded (513 / dropped on streams)
    │   ├── UnframeableStreamError   a stream whose message boundaries cannot be found (Content-Length
    │   │                            unreadable or given twice differently): the connection must go
    │   └── IncompleteMessageError   the input ended before the message did (stream: wait for more)
    ├── LocalProtocolError           we were asked to do something illegal (answer a call twice, ...)
    └── SipConfigError               `SipConfig` failed validation at start-up

The endpoint never lets any of these escape `SipEndpoint.receive`: remote errors are answered or
counted and dropped there. Local errors do escape the action methods, since they are programming errors
of the caller (h11 keeps the same split between LocalProtocolError and RemoteProtocolError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .message import SipMessage


class SipError(Exception):
    """Base class of every error raised by gateway.sip."""


class RemoteProtocolError(SipError):
    """The peer violated RFC 3261 (or a limit); answer `status_code` when a response can be built."""

    def __init__(self, reason: str, *, status_code: int = 400, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code
        self.headers = headers


class MalformedMessageError(RemoteProtocolError):
    """The start line parsed, but a header line or the body did not; `partial` holds what did parse."""

    def __init__(self, reason: str, *, partial: SipMessage | None, status_code: int = 400) -> None:
        super().__init__(reason, status_code=status_code)
        self.partial = partial


class MessageTooLargeError(RemoteProtocolError):
    """A message, header or body exceeded the configured `SipLimits`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, status_code=513)


class UnframeableStreamError(RemoteProtocolError):
    """On a stream, where a message ends cannot be known (§18.3: Content-Length decides), so nothing after it can
    be read either."""


class IncompleteMessageError(RemoteProtocolError):
    """The data ended inside the start line, headers or body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, status_code=400)


class LocalProtocolError(SipError):
    """The application asked the core for something illegal in the current state."""


class SipConfigError(SipError):
    """A SIP configuration value is invalid."""
