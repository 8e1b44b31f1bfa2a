"""Provider errors.

::

    ProviderError(retryable: bool)
     ├── ProviderConnectError      connecting or the setup handshake failed
     ├── ProviderClosedError       the connection is gone (send after close, remote close)
     ├── ProviderProtocolError     the provider sent something we cannot interpret
     └── ProviderConfigError       the provider cannot be built from the configuration (missing key, bad name)

Third-party exceptions (``websockets``, ``OSError``, timeouts) are translated into this tree where the adapters
touch the network; nothing else escapes an adapter's public methods.
"""

from __future__ import annotations


class ProviderError(Exception):
    """A realtime provider failed. ``retryable`` says whether a new connection may continue the call."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class ProviderConnectError(ProviderError):
    """Connecting to the provider or its setup handshake failed."""


class ProviderClosedError(ProviderError):
    """The connection is closed; nothing more can be sent on it."""

    def __init__(self, message: str = "provider connection is closed", *, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)


class ProviderProtocolError(ProviderError):
    """The provider sent something that does not follow its wire protocol."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message, retryable=retryable)


class ProviderConfigError(ProviderError):
    """The provider cannot be built: unknown name, missing API key, malformed URL. Never retryable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
