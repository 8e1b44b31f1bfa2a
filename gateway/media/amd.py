"""Answering-machine detection over the first seconds of an answered outbound call (sans-I/O).

Owns: `AmdConfig`, `AnsweringMachineDetector` and what it reports, `AmdDecided` (human, machine, fax or
unknown, with the rule that decided) and `BeepHeard` (the machine's tone: the moment to leave a message).

Fed the callee's audio frame by frame (any rate from 8 kHz, PCM16), it runs the timing rules that carriers'
and PBXs' detectors use as their baseline (Asterisk's app_amd has the same parameters), over words found by
frame energy:

    initial silence   nothing said for `initial_silence_s` after the answer         -> machine
    long greeting     speech adding up to `greeting_s` before a pause                  -> machine
    many words        `max_words` words before a pause                                 -> machine
    short greeting    speech, then `after_greeting_silence_s` of silence ("Hello?" ...) -> human
    beep              a steady pure tone of `beep_min_s` (400-2100 Hz) before any decision -> machine
    fax               CNG, 1100 Hz for `cng_min_s`                                     -> fax
    time out          no rule decided within `total_s`                                 -> unknown

A pure tone is never counted as speech, so a beep or CNG does not make words. After a machine decision the
detector keeps listening for the beep (`BeepHeard`, reported when the beep has ended) so that a message starts
after it; `beep_wait_s` bounds
the wait (then `BeepHeard` comes with `frequency_hz=None`, once the greeting has been silent for
`after_greeting_silence_s`). The words a pipeline's STT hears can refine a decision; this module is the
audio-only baseline.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "AmdConfig",
    "AmdDecided",
    "AmdEvent",
    "AmdResult",
    "AnsweringMachineDetector",
    "BeepHeard",
    "frame_voiced",
]


class AmdResult(enum.StrEnum):
    HUMAN = "human"
    MACHINE = "machine"
    FAX = "fax"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class AmdConfig:
    initial_silence_s: float = 2.5
    greeting_s: float = 1.5
    after_greeting_silence_s: float = 0.8
    total_s: float = 5.0
    min_word_s: float = 0.1
    between_words_silence_s: float = 0.05
    max_words: int = 4
    speech_dbfs: float = -42.0  # a frame louder than this (and not a pure tone) is voiced
    beep_min_s: float = 0.12
    cng_min_s: float = 0.4
    beep_wait_s: float = 20.0

    def __post_init__(self) -> None:
        if min(self.initial_silence_s, self.greeting_s, self.after_greeting_silence_s, self.total_s) <= 0:
            raise ValueError("AMD times must be positive")
        if self.max_words < 1 or self.min_word_s <= 0 or self.beep_min_s <= 0 or self.cng_min_s <= 0:
            raise ValueError("AMD needs max_words >= 1 and positive word and tone lengths")


@dataclass(frozen=True, kw_only=True)
class AmdDecided:
    result: AmdResult
    reason: str  # initial_silence, long_greeting, many_words, short_greeting, beep, fax_tone, timeout
    at_s: float  # seconds of audio after the answer when it was decided
    words: int
    speech_s: float


@dataclass(frozen=True, kw_only=True)
class BeepHeard:
    """The moment to leave a message: reported when the beep has ended (a message spoken over the beep's tail is
    not recorded by the machine), ``at_s`` being where it started."""

    at_s: float
    frequency_hz: float | None  # None: no beep came; the greeting ended in silence (or the wait ran out)
    ended_at_s: float | None = None  # where the beep ended (None: no beep)


AmdEvent = AmdDecided | BeepHeard

_BEEP_BAND = (400.0, 2100.0)
_CNG_HZ = 1100.0
_TONE_PURITY = 0.75  # share of a frame's energy in its strongest bin and its neighbours
_TONE_STEADY_HZ = 40.0
_BEEP_MAX_S = 3.0  # a tone that goes on longer is taken as ended there (the wait stays bounded)


def frame_voiced(frame: npt.NDArray[np.int16], speech_dbfs: float) -> bool:
    """Louder than ``speech_dbfs`` (energy only: what follows a decision, for amd_words.AmdCombiner)."""
    if frame.size == 0:
        return False
    samples = frame.astype(np.float64)
    power = float(np.dot(samples, samples)) / samples.size
    return bool(10.0 * np.log10(power / (32768.0**2) + 1e-12) > speech_dbfs)


class AnsweringMachineDetector:
    """One per answered call. `feed` takes the callee's frames in order and returns what they decided."""

    def __init__(self, config: AmdConfig | None = None, *, sample_rate: int = 24_000) -> None:
        if sample_rate < 8000:
            raise ValueError("AMD needs at least 8 kHz audio")
        self.config = config or AmdConfig()
        self.sample_rate = sample_rate
        self.decision: AmdDecided | None = None
        self.beep: BeepHeard | None = None
        self._done = False  # decided, and (for a machine) its beep or its greeting's end heard
        self._t = 0.0  # seconds fed
        self._words = 0
        self._speech_s = 0.0
        self._voiced_run = 0.0
        self._silent_run = 0.0
        self._in_word = False
        self._heard_speech = False
        self._tone_hz: float | None = None
        self._tone_run = 0.0
        self._tone_started = 0.0
        self._beep_on: tuple[float, float] | None = None  # a beep long enough, still sounding: (start, Hz)
        self._window: npt.NDArray[np.float64] = np.hanning(sample_rate // 50)

    def feed(self, frame: npt.NDArray[np.int16]) -> list[AmdEvent]:
        if frame.size == 0 or self._done:
            return []
        duration = frame.size / self.sample_rate
        self._t += duration
        samples = frame.astype(np.float64)
        power = float(np.dot(samples, samples)) / samples.size
        dbfs = 10.0 * np.log10(power / (32768.0**2) + 1e-12)
        tone = self._pure_tone(samples) if dbfs > self.config.speech_dbfs else None
        events: list[AmdEvent] = []
        tone_event = self._track_tone(tone, duration)
        if tone_event is not None:
            events.append(tone_event)
        elif self._beep_on is not None:
            pass  # the beep still sounds: its end is the moment
        elif self.decision is None:
            decided = self._words_and_silences(voiced=dbfs > self.config.speech_dbfs and tone is None, dt=duration)
            if decided is not None:
                events.append(decided)
        else:
            self._after_decision(voiced=dbfs > self.config.speech_dbfs and tone is None, dt=duration, events=events)
        return events

    # --- tones --------------------------------------------------------------------------------------------

    def _pure_tone(self, samples: npt.NDArray[np.float64]) -> float | None:
        """The frequency of a frame that is one steady sine (a beep, CNG), or None for anything else."""
        window = self._window
        if window.size != samples.size:
            window = self._window = np.hanning(samples.size)
        spectrum = np.abs(np.fft.rfft(samples * window)) ** 2
        total = float(spectrum.sum())
        if total <= 0.0:
            return None
        peak = int(np.argmax(spectrum))
        share = float(spectrum[max(peak - 2, 0) : peak + 3].sum()) / total
        if share < _TONE_PURITY:
            return None
        return peak * self.sample_rate / samples.size

    def _track_tone(self, hz: float | None, dt: float) -> AmdEvent | None:
        if hz is None or not (_BEEP_BAND[0] <= hz <= _BEEP_BAND[1]):
            self._tone_hz, self._tone_run = None, 0.0
            return self._beep_ended(self._t - dt)
        if self._tone_hz is None or abs(hz - self._tone_hz) > _TONE_STEADY_HZ:
            ended = self._beep_ended(self._t - dt)
            self._tone_hz, self._tone_run, self._tone_started = hz, 0.0, self._t - dt
            if ended is not None:
                return ended
        self._tone_run += dt
        is_cng = abs(self._tone_hz - _CNG_HZ) <= _TONE_STEADY_HZ
        if self.decision is None and is_cng and self._tone_run >= self.config.cng_min_s:
            return self._decide(AmdResult.FAX, "fax_tone")
        if self._beep_on is None and self._tone_run >= self.config.beep_min_s and (self.decision or not is_cng):
            self._beep_on = (self._tone_started, self._tone_hz)
            if self.decision is None:
                return self._decide(AmdResult.MACHINE, "beep")  # decided now; the moment comes when it ends
        if self._beep_on is not None and self._tone_run >= _BEEP_MAX_S:
            return self._beep_ended(self._t)
        return None

    def _beep_ended(self, at_s: float) -> BeepHeard | None:
        if self._beep_on is None or self._done:
            return None
        started, hz = self._beep_on
        self.beep = BeepHeard(at_s=round(started, 3), frequency_hz=round(hz, 1), ended_at_s=round(at_s, 3))
        self._done = True
        return self.beep

    # --- speech -------------------------------------------------------------------------------------------

    def _words_and_silences(self, *, voiced: bool, dt: float) -> AmdDecided | None:
        cfg = self.config
        if voiced:
            self._voiced_run += dt
            self._silent_run = 0.0
            self._speech_s += dt
            if not self._in_word and self._voiced_run >= cfg.min_word_s:
                self._in_word, self._heard_speech = True, True
                self._words += 1
                if self._words >= cfg.max_words:
                    return self._decide(AmdResult.MACHINE, "many_words")
            if self._heard_speech and self._speech_s >= cfg.greeting_s:
                return self._decide(AmdResult.MACHINE, "long_greeting")
        else:
            self._silent_run += dt
            if self._silent_run >= cfg.between_words_silence_s:
                self._in_word, self._voiced_run = False, 0.0
            if not self._heard_speech and self._silent_run >= cfg.initial_silence_s:
                return self._decide(AmdResult.MACHINE, "initial_silence")
            if self._heard_speech and self._silent_run >= cfg.after_greeting_silence_s:
                return self._decide(AmdResult.HUMAN, "short_greeting")
        if self._t >= cfg.total_s:
            return self._decide(AmdResult.UNKNOWN, "timeout")
        return None

    def _after_decision(self, *, voiced: bool, dt: float, events: list[AmdEvent]) -> None:
        """A machine's greeting goes on until its beep; no beep: its end, or the wait's, is the moment."""
        assert self.decision is not None
        self._silent_run = 0.0 if voiced else self._silent_run + dt
        waited = self._t - self.decision.at_s
        greeting_over = self._heard_speech and self._silent_run >= 2 * self.config.after_greeting_silence_s
        if greeting_over or waited >= self.config.beep_wait_s:
            self.beep = BeepHeard(at_s=round(self._t, 3), frequency_hz=None)
            self._done = True
            events.append(self.beep)
        if voiced:
            self._heard_speech = True

    def listen_for_beep(self) -> None:
        """Something else (the greeting's words) judged it a machine: listen for its beep from now on, as after a
        machine decision of the detector's own (bounded the same way)."""
        if self.beep is not None:
            return
        if self.decision is None or self.decision.result is not AmdResult.MACHINE:
            self.decision = AmdDecided(
                result=AmdResult.MACHINE,
                reason="words",
                at_s=round(self._t, 3),
                words=self._words,
                speech_s=round(self._speech_s, 3),
            )
        self._done = False

    def _decide(self, result: AmdResult, reason: str) -> AmdDecided:
        self.decision = AmdDecided(
            result=result, reason=reason, at_s=round(self._t, 3), words=self._words, speech_s=round(self._speech_s, 3)
        )
        if result is not AmdResult.MACHINE:
            self._done = True  # only a machine's beep is worth waiting for
        return self.decision
