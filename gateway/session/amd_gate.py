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

With a words source (``words`` set: the call has an STT on the callee's greeting) the timing verdict goes through
:class:`~gateway.media.amd_words.AmdCombiner` first: :meth:`AmdGate.words` hands it each recognised text, and the
decision is the combiner's (a machine phrase, a short "hello?", speech that went on after a pause), bounded by
its hold so that late words never stall the call. A beep ends any hold: it is a machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from gateway.media.amd import AmdDecided, AmdResult, AnsweringMachineDetector, BeepHeard, frame_voiced
from gateway.media.amd_words import AmdCombiner, AmdVerdict, WordsConfig

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

    def __init__(
        self,
        policy: AmdPolicy,
        *,
        detector: AnsweringMachineDetector | None = None,
        words: WordsConfig | None = None,
    ) -> None:
        self.policy = policy
        self.detector = detector if detector is not None else AnsweringMachineDetector()
        self.combiner = AmdCombiner(words) if words is not None else None
        self.open = True
        self.report: AmdReport | None = None
        self.decided: AmdDecided | None = None  # the final decision (the combiner's, with words)
        self._t = 0.0

    @property
    def heard(self) -> str:
        """The greeting's words recognised until the decision ("" without a words source)."""
        return self.combiner.heard if self.combiner is not None else ""

    def feed(self, pcm: npt.NDArray[np.int16]) -> AmdAction | None:
        """One callee frame (24 kHz PCM16); the action due, if any. The gate closes with the action it returns."""
        if not self.open:
            return None
        dt = pcm.size / self.detector.sample_rate
        self._t += dt
        action: AmdAction | None = None
        for event in self.detector.feed(pcm):
            if isinstance(event, AmdDecided) and self.decided is None:
                verdict = self.combiner.timing(event) if self.combiner is not None else _as_verdict(event)
                if verdict is not None:
                    action = self._decide(verdict)
            elif isinstance(event, BeepHeard) and self.open:
                action = self._beep(event)
            if action is not None:
                return self._close(action)
        combiner = self.combiner
        if combiner is not None and self.decided is None:
            verdict = combiner.audio(voiced=frame_voiced(pcm, self.detector.config.speech_dbfs), dt=dt)
            if verdict is not None:
                action = self._decide(verdict)
        return self._close(action) if action is not None else None

    def words(self, text: str) -> AmdAction | None:
        """Text the STT recognised in the greeting (now, on the audio clock); the action due, if any."""
        if not self.open or self.combiner is None or self.decided is not None:
            return None
        verdict = self.combiner.words(text, at_s=self._t)
        if verdict is None:
            return None
        action = self._decide(verdict)
        return self._close(action) if action is not None else None

    def _close(self, action: AmdAction) -> AmdAction:
        self.open = False
        return action

    def _decide(self, verdict: AmdVerdict) -> AmdAction | None:
        timing = verdict.timing
        self.decided = AmdDecided(
            result=verdict.result,
            reason=verdict.reason,
            at_s=verdict.at_s,
            words=timing.words if timing is not None else 0,
            speech_s=timing.speech_s if timing is not None else 0.0,
        )
        self.report = AmdReport(result=verdict.result.value, reason=verdict.reason, at_s=verdict.at_s)
        if verdict.result is AmdResult.MACHINE:
            self.detector.listen_for_beep()  # the words or the combiner may have decided what the timing did not
        return self._on_decision(verdict.result)

    def _beep(self, beep: BeepHeard) -> AmdAction | None:
        if self.decided is None:  # still holding for words: a beep settles it (the greeting's end does not)
            if beep.frequency_hz is None:
                return None  # kept in detector.beep: the moment, if the combiner then says machine
            assert self.detector.decision is not None
            action = self._decide(_as_verdict(self.detector.decision, result=AmdResult.MACHINE, at_s=beep.at_s))
            if action != "leave_message" and action is not None:
                return action
        if self.report is None:
            return None
        self.report = AmdReport(
            result=self.report.result, reason=self.report.reason, at_s=self.report.at_s, beep_at_s=beep.at_s
        )
        return "leave_message" if self.policy.mode == "detect_and_leave_message" else "hang_up"

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


def _as_verdict(decided: AmdDecided, *, result: AmdResult | None = None, at_s: float | None = None) -> AmdVerdict:
    return AmdVerdict(
        result=result or decided.result,
        reason=decided.reason,
        at_s=decided.at_s if at_s is None else at_s,
        timing=decided,
    )
