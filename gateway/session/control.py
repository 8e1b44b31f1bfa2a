"""What the session may ask of the call's signalling leg: the CallControl protocol the worker implements over SIP.

``transfer`` is a blind transfer (RFC 3515 REFER, progress tracked through NOTIFY sipfrag per RFC 3515 §2.4.5);
``send_dtmf`` sends RFC 4733 telephone-events toward the caller; ``hang_up`` ends the call (BYE, RFC 3261 §15);
``hold`` re-INVITEs with a=sendonly (RFC 3264 §8.4) and plays the hold audio, or a=sendrecv to resume;
``warm_transfer`` brings a human in, briefed, and joins them with the caller (gateway/worker/warm.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferOutcome:
    """How a blind transfer ended.

    ``accepted``: the target answered (NOTIFY with a 2xx sipfrag); the caller is no longer ours.
    ``refused``: the REFER itself was rejected (e.g. 403/405/501). ``failed``: accepted, but the target did
    not answer (NOTIFY with a final non-2xx) or tracking timed out.
    """

    status: Literal["accepted", "refused", "failed"]
    sip_status: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmTransferStart:
    """How a warm transfer's start went: ``dialling`` (the caller is on hold, the human's phone rings; the agent
    is told the outcome later, if the human is not reached) or ``refused`` (``detail`` says why)."""

    status: Literal["dialling", "refused"]
    transfer_id: str = ""
    detail: str = ""


class CallControl(Protocol):
    async def hang_up(self, reason: str) -> None:
        """End the call toward the caller. Must be idempotent."""
        ...

    async def transfer(self, target: str) -> TransferOutcome:
        """Blind-transfer the caller to ``target`` (SIP URI or number) and report the outcome."""
        ...

    async def send_dtmf(self, digits: str) -> None:
        """Play ``digits`` (0-9, *, #, A-D) to the caller as RFC 4733 events."""
        ...

    async def hold(self, held: bool) -> None:
        """Put the caller on hold (True) or take them off it; raises, naming why, when the call cannot be."""
        ...

    async def warm_transfer(
        self, target: str, summary: str, briefing: Literal["spoken", "conversation"] | None = None
    ) -> WarmTransferStart:
        """Dial a human at ``target``, brief them with ``summary`` (``briefing``: said as one turn, or a
        conversation with the human; None: the worker's setting) and join them with the caller
        (gateway/worker/warm.py); returns once their phone rings, or refused."""
        ...


@runtime_checkable
class BriefingControl(Protocol):
    """What a conversational warm-transfer briefing's session (on the human's leg) may ask of its call, besides
    CallControl: join the waiting caller now, or decline the call. A control without it has no such tools' use."""

    async def end_briefing(self, *, connect: bool, reason: str = "") -> str:
        """Connect the caller (``connect``) or decline with ``reason``; returns "" when done, else why not."""
        ...
