"""G.711 between the session and a provider for profiles with ``audio_format`` "pcmu" or "pcma" (ITU-T G.711, 8 kHz).

Toward the provider (:class:`G711Transcoder`): caller frames from a G.711 caller carry the caller's own codes,
which go to the provider unchanged (or through the G.711 tables when the laws differ); other callers' frames
are resampled to 8 kHz and encoded before they are sent.

From the provider: its codes are not converted on arrival. Playout (:mod:`gateway.session.playout`) frames them
per item, 160 codes a frame, an item's part-frame carried to its next delta and its last part-frame completed
with silence codes, and counts them in 24 kHz samples (three per code), so barge-in accounting is the same as
for PCM. When a frame is played, a G.711 caller is sent the codes themselves (the media tick converts the law
if the caller's differs, and never resamples them); any other caller gets 24 kHz PCM made here
(:class:`G711Playback`): decoded through the tables and resampled 8k->24k, one frame at a time, only for the
frames such a caller is actually sent.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from telcodecs.frames import SAMPLE_RATE, Frame, G711Law, Pcm
from telcodecs.g711 import alaw_decode, alaw_encode, alaw_to_ulaw, ulaw_decode, ulaw_encode, ulaw_to_alaw
from telcodecs.resample import StreamResampler

G711_RATE = 8000
G711_FRAME = G711_RATE // 50  # codes (bytes) per 20 ms

_DECODE: dict[G711Law, Callable[[bytes], npt.NDArray[np.int16]]] = {"pcmu": ulaw_decode, "pcma": alaw_decode}
# Codes of the other law -> codes of this law, code by code through the G.711 tables.
_FROM_OTHER_LAW: dict[G711Law, Callable[[bytes], bytes]] = {"pcmu": alaw_to_ulaw, "pcma": ulaw_to_alaw}


class G711Transcoder:
    """Caller frames -> the provider's G.711 (one per connection of a G.711 profile)."""

    def __init__(self, law: G711Law) -> None:
        self.law = law
        self._encode: Callable[[npt.NDArray[np.int16]], bytes] = ulaw_encode if law == "pcmu" else alaw_encode
        self._from_other = _FROM_OTHER_LAW[law]
        self._down = StreamResampler(SAMPLE_RATE, G711_RATE)

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
                out.append(self._from_other(codes))
        return b"".join(out)


class G711Playback:
    """The provider's G.711 frames -> 24 kHz PCM, for a caller that is sent PCM (browser, Opus).

    One resampler serves the call's played code frames as one stream. A frame that does not directly follow
    the previous one rendered here (by the call's outbound frame index) starts the stream afresh: the frames
    between were silence, PCM or codes sent as they are, none of which passed through this resampler, and a
    zero history is exactly what a continuous stream has after a frame of silence.
    """

    def __init__(self) -> None:
        self._up = StreamResampler(G711_RATE, SAMPLE_RATE)
        self._next_index = -1

    def pcm(self, codes: bytes, law: G711Law, *, index: int) -> Pcm:
        """160 codes of ``law`` -> 480 samples (read-only); ``index`` is the outbound frame's index."""
        if index != self._next_index:
            self._up.reset()
        self._next_index = index + 1
        pcm = self._up.process(_DECODE[law](codes))
        pcm.flags.writeable = False
        return pcm
