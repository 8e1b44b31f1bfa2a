"""G.711 toward a provider for profiles with ``audio_format`` "pcmu" or "pcma" (ITU-T G.711, 8 kHz).

The session speaks the frame contract (24 kHz PCM16, 20 ms) on both sides; an adapter in G.711 mode passes
bytes through unchanged (the provider seam's passthrough). Between the two this module converts: caller frames
are resampled to 8 kHz and encoded before they are sent, and the provider's G.711 audio is decoded and resampled
to 24 kHz before it reaches playout, so barge-in accounting (milliseconds sent to the caller) stays in the
provider item's own time base.

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
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.resample import StreamResampler

G711_RATE = 8000
G711_FRAME = G711_RATE // 50  # codes (bytes) per 20 ms

_Key = tuple[str, str, int]


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

    def encode(self, pcm: bytes) -> bytes:
        """Caller audio: whole 20 ms frames of 24 kHz PCM16 -> G.711 codes at 8 kHz."""
        samples = np.frombuffer(pcm, dtype="<i2")
        return b"".join(
            self._encode(self._down.process(samples[start : start + FRAME_SAMPLES]))
            for start in range(0, samples.size - FRAME_SAMPLES + 1, FRAME_SAMPLES)
        )

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
