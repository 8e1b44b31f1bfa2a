"""A port the kernel has free, for a process about to be told where to listen."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1", *, kind: int = socket.SOCK_STREAM) -> int:
    """A port of ``kind`` (``SOCK_STREAM`` or ``SOCK_DGRAM``) that was free on ``host`` a moment ago; another
    process may take it before the caller binds it, so a caller that can bind port 0 itself should."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
