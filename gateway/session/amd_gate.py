"""Answering-machine detection on an outbound call: what the session does with the detector's decision.

Sans-I/O: the session feeds :meth:`AmdGate.feed` each callee frame while the gate is ``open`` (undecided, or a
machine whose beep is awaited); the gate answers with the action due. Until then no frame reaches the provider and
the agent does not greet.

Rules::

    human | unknown            -> "greet"      (the agent greets as usual; frames flow from then on)
    fax                        -> "hang_up"    end reason fax_detected
    machine + detect           -> "hang_up"    end reason machine_detected
    machine + leave_message    -> (wait for the beep, or the greeting's end) -> "leave_message", then the call ends
                                  voicemail_left once the message has been played
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from gateway.media.amd import AmdDecided, AmdResult, AnsweringMachineDetector, BeepHeard

AmdMode = Literal["detect", "detect_and_leave_message"]
AmdAction = Literal["greet", "hang_up", "leave_message"]

END_REASONS: dict[AmdResult, str] = {AmdResult.FAX: "fax_detected", AmdResult.MACHINE: "machine_detected"}
VOICEMAIL_LEFT = "voicemail_left"


class AmdPolicyError(ValueError):
    """An AMD policy that cannot work (leave a message without one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AmdPolicy:
    mode: AmdMode = "detect"
    voicemail_message: str = ""

    def __post_init__(self) -> None:
        if self.mode == "detect_and_leave_message" and not self.voicemail_message.strip():
            raise AmdPolicyError("detect_and_leave_message needs a voicemail message")


@dataclass(frozen=True, slots=True, kw_only=True)
class AmdReport:
    """The decision as the call's snapshot and record show it."""

    result: str
    reason: str
    at_s: float
    beep_at_s: float | None = None


class AmdGate:
    """One call's detection. ``open``: frames still go to the detector, not to the provider."""

    def __init__(self, policy: AmdPolicy, *, detector: AnsweringMachineDetector | None = None) -> None:
        self.policy = policy
        self.detector = detector if detector is not None else AnsweringMachineDetector()
        self.open = True
        self.report: AmdReport | None = None
        self.decided: AmdDecided | None = None

    def feed(self, pcm: npt.NDArray[np.int16]) -> AmdAction | None:
        """One callee frame (24 kHz PCM16); the action due, if any. The gate closes with the action it returns."""
        if not self.open:
            return None
        action: AmdAction | None = None
        for event in self.detector.feed(pcm):
            if isinstance(event, AmdDecided) and self.decided is None:
                self.decided = event
                self.report = AmdReport(result=event.result.value, reason=event.reason, at_s=event.at_s)
                action = self._on_decision(event.result)
            elif isinstance(event, BeepHeard) and self.report is not None and self.open:
                self.report = AmdReport(
                    result=self.report.result, reason=self.report.reason, at_s=self.report.at_s, beep_at_s=event.at_s
                )
                action = "leave_message"
            if action is not None:
                self.open = False
                return action
        return None

    def _on_decision(self, result: AmdResult) -> AmdAction | None:
        if result is AmdResult.HUMAN or result is AmdResult.UNKNOWN:
            return "greet"
        if result is AmdResult.MACHINE and self.policy.mode == "detect_and_leave_message":
            beep = self.detector.beep
            if beep is not None and self.report is not None:  # decided by the beep itself: the moment is now
                self.report = AmdReport(
                    result=self.report.result, reason=self.report.reason, at_s=self.report.at_s, beep_at_s=beep.at_s
                )
                return "leave_message"
            return None  # keep listening for the beep
        return "hang_up"

    @property
    def end_reason(self) -> str:
        """The end reason of a "hang_up" action."""
        assert self.decided is not None
        return END_REASONS.get(self.decided.result, "machine_detected")
