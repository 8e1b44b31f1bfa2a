"""Client-side websocket text frames for the media tick's provider writes (RFC 6455 section 5.2), sans-I/O.

A client must mask every frame it sends with a fresh key from a strong source of entropy (RFC 6455 section
5.3). ``websockets`` draws each key with ``secrets.token_bytes(4)``: one ``getrandom`` system call per frame,
and a ``Frame`` object and a ``BytesIO`` per message besides: at 50 messages per call per second the system call
alone showed in a worker's profile (docs/adr/0009-provider-text-frames.md).

:class:`TextFrames` builds the same bytes with keys taken from a block of ``os.urandom`` drawn once per
:data:`KEYS_PER_DRAW` frames, the header packed with :mod:`struct` and the payload masked by the library's
own ``apply_mask`` (its C speedup, as the library picks it). It frames only whole (FIN) text messages
without extensions, the one kind the tick sends; everything else still goes through the connection's own
protocol object.
"""

from __future__ import annotations

import os
import struct

try:  # the library's C masking; its pure-Python fallback where the extension was not built
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

KEYS_PER_DRAW = 1024
"""Mask keys drawn from ``os.urandom`` at a time: one system call per this many frames."""

_FIN_TEXT = 0x81  # FIN bit + opcode 0x1 (text)
_MASKED = 0x80
_HEAD_SHORT = struct.Struct("!BB")
_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


class TextFrames:
    """Serialize whole, masked text frames. ``frame(payload)`` returns the bytes to write to the socket."""

    def __init__(self, keys_per_draw: int = KEYS_PER_DRAW) -> None:
        if keys_per_draw < 1:
            raise ValueError("keys_per_draw must be at least 1")
        self._keys_per_draw = keys_per_draw
        self._keys = b""
        self._next = 0

    def frame(self, payload: bytes) -> bytes:
        key = self._key()
        length = len(payload)
        if length < 126:
            head = _HEAD_SHORT.pack(_FIN_TEXT, _MASKED | length)
        elif length < 65536:
            head = _HEAD_16.pack(_FIN_TEXT, _MASKED | 126, length)
        else:
            head = _HEAD_64.pack(_FIN_TEXT, _MASKED | 127, length)
        return b"".join((head, key, apply_mask(payload, key)))

    def _key(self) -> bytes:
        start = self._next
        if start == len(self._keys):
            self._keys = os.urandom(4 * self._keys_per_draw)
            start = 0
        self._next = start + 4
        return self._keys[start : start + 4]
