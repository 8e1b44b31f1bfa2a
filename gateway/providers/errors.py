"""Provider errors. The tree is drawn in :mod:`gateway.providers.base`."""

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
