"""Audio between the session's format and the stream's wire format, both directions, synchronous with state.

The session gives and takes either the 24 kHz PCM16 frame contract or, for a profile with ``audio_format``
"pcmu"/"pcma", 8 kHz G.711 codes (:mod:`gateway.session.g711`). The wire carries 8 kHz mu-law (Twilio's only
format) or 16-bit little-endian PCM at 16 or 24 kHz. Mu-law on the wire and a "pcmu" profile is the fast path:
the codes pass untouched both ways, and a G.711 caller's own codes reach the bot unchanged.

Toward the bot, the session hands over whole 20 ms frames, so every chunk is exactly 20 ms. From the bot, a
payload may have any length: whatever does not fill a 20 ms frame of the resampler waits for the next payload,
and :meth:`AudioBridge.flush` pads and converts the rest (at a mark, when the bot has finished an utterance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from gateway.providers.errors import ProviderConfigError
from gateway.providers.media_stream.protocol import MediaFormat
from telcodecs.g711 import ULAW_SILENCE, alaw_to_ulaw, ulaw_decode, ulaw_encode, ulaw_to_alaw
from telcodecs.resample import StreamResampler

SessionFormat = Literal["pcm24k", "pcmu", "pcma"]
_SESSION_RATE = 24_000
_FRAME_BYTES = 960  # 20 ms of 24 kHz PCM16
_G711_FRAME = 160


def _identity(data: bytes) -> bytes:
    return data


class AudioBridge:
    """One stream's converters; made per connection (resampler state belongs to one stream)."""

    def __init__(self, media_format: MediaFormat, session_format: SessionFormat) -> None:
        self.media_format = media_format
        self.session_format = session_format
        wire = media_format.wire
        if wire != "mulaw" and session_format != "pcm24k":
            raise ProviderConfigError(
                f"wire audio {wire!r} needs the profile's audio_format 'pcm24k' (got {session_format!r}); "
                "use wire audio 'mulaw' with a G.711 profile"
            )
        self._in_chunk = _FRAME_BYTES if session_format == "pcm24k" else _G711_FRAME  # session bytes per 20 ms
        self._wire_chunk = media_format.chunk_bytes
        self._carry = b""  # wire bytes waiting for a whole resampler frame (or an odd byte of PCM16)
        self._down: StreamResampler | None = None
        self._up: StreamResampler | None = None
        self._to_codes: Callable[[bytes], bytes] = _identity
        self._from_codes: Callable[[bytes], bytes] = _identity
        if session_format == "pcmu":
            pass
        elif session_format == "pcma":
            self._to_codes, self._from_codes = alaw_to_ulaw, ulaw_to_alaw
        elif media_format.sample_rate != _SESSION_RATE:
            self._down = StreamResampler(_SESSION_RATE, media_format.sample_rate)
            self._up = StreamResampler(media_format.sample_rate, _SESSION_RATE)

    @property
    def passthrough(self) -> bool:
        """Codes or samples cross unchanged (mu-law with "pcmu", 24 kHz PCM with "pcm24k")."""
        return self._down is None and self._to_codes is _identity

    def wire_ms(self, payload_bytes: int) -> float:
        fmt = self.media_format
        return payload_bytes / fmt.sample_bytes * 1000.0 / fmt.sample_rate

    # --------------------------------------------------------------------------------------- to the bot

    def to_wire(self, data: bytes) -> list[bytes]:
        """Session audio (whole 20 ms frames) -> one wire payload per 20 ms."""
        step = self._in_chunk
        frames = [data[i : i + step] for i in range(0, len(data) - len(data) % step, step)]
        if self._down is None:
            convert = self._to_codes
            return [convert(frame) for frame in frames]
        down = self._down
        if self.media_format.wire == "mulaw":
            return [ulaw_encode(down.process(np.frombuffer(frame, dtype="<i2"))) for frame in frames]
        return [down.process(np.frombuffer(frame, dtype="<i2")).astype("<i2").tobytes() for frame in frames]

    # ------------------------------------------------------------------------------------- from the bot

    def from_wire(self, payload: bytes) -> bytes:
        """A bot payload -> session audio; a part-frame waits for the next payload (or :meth:`flush`)."""
        if self._up is None:
            if self.media_format.sample_bytes == 1:
                return self._from_codes(payload)
            data = self._carry + payload if self._carry else payload
            whole = len(data) - len(data) % 2
            self._carry = data[whole:]
            return data[:whole]
        data = self._carry + payload if self._carry else payload
        step = self._wire_chunk
        whole = len(data) - len(data) % step
        self._carry = data[whole:]
        return b"".join(self._up_frame(data[i : i + step]) for i in range(0, whole, step))

    def flush(self) -> bytes:
        """The waiting part-frame, padded with silence and converted (b"" when nothing waits)."""
        carry, self._carry = self._carry, b""
        if not carry or self._up is None:
            return b""  # PCM16 at the session rate waits only for an odd byte: nothing to pad it into
        pad = bytes([ULAW_SILENCE]) if self.media_format.wire == "mulaw" else b"\x00"
        return self._up_frame(carry + pad * (self._wire_chunk - len(carry)))

    def _up_frame(self, chunk: bytes) -> bytes:
        assert self._up is not None
        if self.media_format.wire == "mulaw":
            samples = ulaw_decode(chunk)
        else:
            samples = np.frombuffer(chunk, dtype="<i2").astype(np.int16)
        return self._up.process(samples).astype("<i2").tobytes()
