"""What the tick benchmarks share: a call leg that does nothing, the speech they send, a tick engine of PCMU calls.

A benchmark's sessions have no signalling leg, so what they ask of it (hang up, transfer, DTMF, hold) does nothing;
its callers speak a voiced, syllable-paced signal, so the speech paths (VAD, resampler, codecs) do their real work.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from gateway.media.call import MediaCallConfig
from gateway.media.tick import TickEngine
from gateway.session.control import TransferOutcome, WarmTransferStart

PEER = ("127.0.0.1", 40000)  # where a benchmark call's RTP goes: nothing listens, nothing is read back


class NullControl:
    """:class:`gateway.session.control.CallControl` of a session without a leg."""

    async def hang_up(self, reason: str) -> None:
        return None

    async def transfer(self, target: str) -> TransferOutcome:
        return TransferOutcome(status="failed", sip_status=0)

    async def send_dtmf(self, digits: str) -> None:
        return None

    async def hold(self, held: bool) -> None:
        return None

    async def warm_transfer(self, target: str, summary: str, briefing: str | None = None) -> WarmTransferStart:
        return WarmTransferStart(status="refused")


def speech_like(seconds: float) -> npt.NDArray[np.int16]:
    """A voiced, syllable-paced signal at 8 kHz (harmonics of a wandering 140 Hz pitch)."""
    t = np.arange(int(8000 * seconds)) / 8000
    phase = 2 * np.pi * np.cumsum(140 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))) / 8000
    harmonics = sum(np.sin(k * phase) / k for k in range(1, 20))
    x = harmonics * (0.3 + 0.7 * np.sin(2 * np.pi * 2 * t) ** 2)
    return np.rint(x / np.abs(x).max() * 10000).astype(np.int16)


def pcmu_engine(call_ids: Iterable[str]) -> TickEngine:
    """A tick engine carrying one PCMU call per id, sending to :data:`PEER`."""
    engine = TickEngine()
    for i, call_id in enumerate(call_ids):
        engine.add_call(
            MediaCallConfig(
                call_id=call_id,
                codec="PCMU",
                payload_type=0,
                remote_rtp=PEER,
                ssrc=1000 + i,
                initial_sequence=0,
                initial_timestamp=0,
                latch_any_source=True,
            ),
            now=0.0,
        )
    return engine
