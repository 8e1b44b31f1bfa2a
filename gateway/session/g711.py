"""G.711 toward a provider for profiles with ``audio_format`` "pcmu" or "pcma" (ITU-T G.711, 8 kHz).

The session speaks the frame contract (24 kHz PCM16, 20 ms) on both sides; an adapter in G.711 mode passes
bytes through unchanged (the provider seam's passthrough). Between the two this module converts: caller frames
from a G.711 caller carry the caller's own codes, which go to the provider unchanged (or through the G.711
tables when the laws differ); other callers' frames are resampled to 8 kHz and encoded before they are sent.
The provider's G.711 audio is decoded and resampled to 24 kHz before it reaches playout, so barge-in
accounting (milliseconds sent to the caller) stays in the provider item's own time base.

Provider deltas are not aligned to 20 ms: the codes of a part-frame are carried to the next delta of the same
item, and an item's last part-frame is completed with silence when the item ends (or the next item starts).
One resampler per direction serves the whole call, as the audio is one continuous stream in each direction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt

from gateway.providers.base import AudioReceived
from telcodecs.frames import SAMPLE_RATE, Frame
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.resample import StreamResampler

G711_RATE = 8000
G711_FRAME = G711_RATE // 50  # codes (bytes) per 20 ms

_Key = tuple[str, str, int]
# Codes in the other law, decoded to linear PCM on the way to this transcoder's law.
_DECODE_OTHER: dict[str, Callable[[bytes], npt.NDArray[np.int16]]] = {"pcmu": alaw_decode, "pcma": ulaw_decode}


class G711Transcoder:
    def __init__(self, law: Literal["pcmu", "pcma"]) -> None:
        self.law = law
        self._encode: Callable[[npt.NDArray[np.int16]], bytes]
        self._decode: Callable[[bytes], npt.NDArray[np.int16]]
        if law == "pcmu":
            self._encode, self._decode, silence = ulaw_encode, ulaw_decode, ULAW_SILENCE
        else:
            self._encode, self._decode, silence = alaw_encode, alaw_decode, ALAW_SILENCE
        self._silence = bytes([silence])
        self._down = StreamResampler(SAMPLE_RATE, G711_RATE)
        self._up = StreamResampler(G711_RATE, SAMPLE_RATE)
        self._carry = b""
        self._carry_key: _Key | None = None

    def encode(self, frames: list[Frame]) -> bytes:
        """Caller frames -> G.711 codes at 8 kHz, 160 per frame.

        A frame that carries the caller's own codes (a G.711 caller, :attr:`Frame.g711`) passes through: as
        they are in the same law, through the G.711 tables (no resampling) in the other. Frames without codes
        (Opus and browser callers) are resampled 24 kHz -> 8 kHz and encoded; a call's frames are one kind or
        the other for its whole life, so the resampler's state stays continuous.
        """
        out = []
        for frame in frames:
            codes = frame.g711
            if codes is None:
                out.append(self._encode(self._down.process(frame.pcm)))
            elif frame.g711_law == self.law:
                out.append(codes)
            else:
                out.append(self._encode(_DECODE_OTHER[self.law](codes)))
        return b"".join(out)

    def decode(self, event: AudioReceived) -> list[AudioReceived]:
        """A provider delta in G.711 -> 24 kHz deltas: a previous item's completed tail first, then this one."""
        key = (event.response_id, event.item_id, event.content_index)
        out = self._flush() if self._carry_key not in (None, key) else []
        data = self._carry + event.pcm
        whole = len(data) - len(data) % G711_FRAME
        self._carry, self._carry_key = data[whole:], key
        if whole:
            out.append(self._decoded(key, data[:whole]))
        return out

    def finish(self, response_id: str, item_id: str) -> list[AudioReceived]:
        """The item's audio ended: its last part-frame, completed with silence."""
        key = self._carry_key
        if key is None or key[:2] != (response_id, item_id):
            return []
        return self._flush()

    def _flush(self) -> list[AudioReceived]:
        key, carry = self._carry_key, self._carry
        self._carry, self._carry_key = b"", None
        if key is None or not carry:
            return []
        return [self._decoded(key, carry + self._silence * (G711_FRAME - len(carry)))]

    def _decoded(self, key: _Key, codes: bytes) -> AudioReceived:
        pcm = self._decode(codes)
        up = [self._up.process(pcm[start : start + G711_FRAME]) for start in range(0, pcm.size, G711_FRAME)]
        data = np.concatenate(up).astype("<i2").tobytes()
        return AudioReceived(response_id=key[0], item_id=key[1], content_index=key[2], pcm=data)
