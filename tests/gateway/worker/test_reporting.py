"""An ended call's last snapshot carries its whole transcript, each item with when it began in the call, and its
tool calls with arguments, results and durations: what the control plane keeps in the database of calls."""

from __future__ import annotations

from gateway.session.transcript import Transcript
from gateway.worker.reporting import TRANSCRIPT_TAIL, tools_of, transcript_of


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Session:
    """What reporting reads of a session: its transcript, its start, its stats (none here)."""

    def __init__(self, transcript: Transcript, started_at: float) -> None:
        self._transcript = transcript
        self.started_at = started_at

    @property
    def transcript(self):  # type: ignore[no-untyped-def]
        return self._transcript.entries()


def _call() -> _Session:
    clock = _Clock()
    transcript = Transcript(clock)
    session = _Session(transcript, started_at=clock.now)
    clock.now += 1.5
    transcript.message("assistant", "Hi, how can I help?")
    clock.now += 2.0
    transcript.speech("user", "item-1", "Where is order A-17?", final=True)
    clock.now += 0.5
    transcript.function_call("call-1", "order_status", '{"order": "A-17"}')
    clock.now += 0.25
    transcript.function_output("call-1", '{"status": "shipped"}')
    transcript.function_call("call-2", "slow_tool", "{}")  # never answered before the call ended
    for n in range(TRANSCRIPT_TAIL + 10):
        clock.now += 1.0
        transcript.message("user", f"line {n}")
    return session


def test_an_ended_call_reports_its_whole_transcript_and_its_tool_calls() -> None:
    session = _call()
    transcript = transcript_of(session, ended=True)  # type: ignore[arg-type]
    assert len(transcript) == TRANSCRIPT_TAIL + 12
    assert [(line.role, line.text, line.start_s) for line in transcript[:2]] == [
        ("assistant", "Hi, how can I help?", 1.5),
        ("user", "Where is order A-17?", 3.5),
    ]
    first, second = tools_of(session)  # type: ignore[arg-type]
    assert (first.name, first.arguments, first.result, first.start_s) == (
        "order_status", '{"order": "A-17"}', '{"status": "shipped"}', 4.0
    )  # fmt: skip
    assert first.duration_ms == 250.0
    assert (second.name, second.result, second.duration_ms) == ("slow_tool", "", None)


def test_a_live_call_reports_the_tail_of_its_transcript() -> None:
    transcript = transcript_of(_call())  # type: ignore[arg-type]
    assert len(transcript) == TRANSCRIPT_TAIL and transcript[-1].text == f"line {TRANSCRIPT_TAIL + 9}"
