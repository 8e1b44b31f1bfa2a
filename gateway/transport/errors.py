"""Errors of the transport layer. Kept apart from the sockets: built-in exception subclasses cannot be compiled
(``gateway.compiled``), so a compiled module raises them from here."""

from __future__ import annotations


class PortsExhaustedError(RuntimeError):
    """No free even port pair is left in the configured RTP range."""
