"""A call session's counters, as one frozen snapshot (:meth:`CallSession.stats`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.session.pipe import ProviderPipe
    from gateway.session.toolrunner import ToolRunner


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStats:
    state: str
    epoch: int  # provider connections so far (1 = the first)
    duration_s: float
    frames_in: int  # caller frames pushed by the media tick
    frames_out: int  # frames returned to the tick (agent audio, prompts, comfort tone)
    frames_to_provider: int
    provider_audio_sends: int  # send_audio calls (fewer than frames when batched)
    frames_held: int  # caller frames that arrived while connecting/resuming
    frames_dropped: int  # caller frames lost to the hold bound (oldest first)
    barge_ins: int
    resumes: int
    rotations: int
    resume_failures: int
    tool_calls: int
    tool_errors: int
    tools_promoted: int
    dtmf_digits: int
    notices: int
    errors: int
    agent_audio_gaps: int  # agent audio ran out while its item was still arriving: a gap the caller heard
    round_trips: int  # caller speech end -> first agent frame sent
    round_trip_ms_last: float | None
    round_trip_ms_mean: float | None

    def counters(self) -> str:
        """The integer counters as ``name=value`` pairs (the call's closing log line)."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return " ".join(f"{name}={value}" for name, value in values if isinstance(value, int))


class RoundTrips:
    """Provider round-trip latency samples (bounded)."""

    def __init__(self, keep: int = 256) -> None:
        self._samples: deque[float] = deque(maxlen=keep)
        self.count = 0

    def add(self, ms: float) -> None:
        self._samples.append(ms)
        self.count += 1

    @property
    def last(self) -> float | None:
        return self._samples[-1] if self._samples else None

    @property
    def mean(self) -> float | None:
        return sum(self._samples) / len(self._samples) if self._samples else None


def snapshot(
    *,
    state: str,
    duration_s: float,
    counts: Mapping[str, int],
    errors: int,
    pipe: ProviderPipe,
    tools: ToolRunner,
    round_trips: RoundTrips,
    agent_audio_gaps: int,
) -> SessionStats:
    """The session's counters as one frozen value."""
    return SessionStats(
        state=state,
        epoch=pipe.epoch,
        duration_s=duration_s,
        frames_in=counts["frames_in"],
        frames_out=counts["frames_out"],
        frames_to_provider=pipe.frames_sent,
        provider_audio_sends=pipe.audio_sends,
        frames_held=pipe.frames_held,
        frames_dropped=pipe.frames_dropped,
        barge_ins=counts["barge_ins"],
        resumes=counts["resumes"],
        rotations=counts["rotations"],
        resume_failures=counts["resume_failures"],
        tool_calls=tools.calls,
        tool_errors=tools.errors,
        tools_promoted=tools.promoted,
        dtmf_digits=counts["dtmf"],
        notices=counts["notices"],
        errors=errors,
        agent_audio_gaps=agent_audio_gaps,
        round_trips=round_trips.count,
        round_trip_ms_last=round_trips.last,
        round_trip_ms_mean=round_trips.mean,
    )
