"""What a call's transcript keeps for its record: each item's start and end in the call and whether a barge-in
cut it; every DTMF digit received or sent, with its time; handoffs counted; and the snapshot the worker reports."""

from __future__ import annotations

from gateway.providers.base import (
    AudioDone,
    AudioReceived,
    ResponseDone,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    TranscriptReceived,
)
from gateway.worker.reporting import build_snapshot
from tests.gateway.session.fakes import FakeClock, FakeModel, drained, make_session, pcm_ms


async def test_items_end_when_spoken_or_cut_and_a_cut_item_says_truncated() -> None:
    clock = FakeClock()
    model = FakeModel()
    session, _ = make_session(model, clock=clock)
    await session.start()
    began = session.started_at
    fake = model.last

    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    clock.advance(1.0)
    fake.emit(SpeechStopped(item_id="u1"), TranscriptReceived(role="user", item_id="u1", text="Hi", final=True))
    await drained(session, fake)
    clock.advance(0.5)
    fake.emit(
        ResponseStarted(response_id="r1"),
        TranscriptReceived(role="assistant", item_id="a1", text="Hello there.", final=True),
        AudioReceived(response_id="r1", item_id="a1", pcm=pcm_ms(60)),
        AudioDone(response_id="r1", item_id="a1"),
        ResponseDone(response_id="r1", status="completed"),
    )
    await drained(session, fake)
    for _ in range(3):
        assert session.pull_outbound() is not None
    clock.advance(0.06)
    assert session.pull_outbound() is None  # played out: a1 ends here

    fake.emit(
        ResponseStarted(response_id="r2"),
        TranscriptReceived(role="assistant", item_id="a2", text="Let me tell you a long story", final=True),
        AudioReceived(response_id="r2", item_id="a2", pcm=pcm_ms(2000)),
    )
    await drained(session, fake)
    assert session.pull_outbound() is not None
    clock.advance(0.3)
    fake.emit(SpeechStarted(item_id="u2"))  # barge-in: a2 is cut
    await drained(session, fake)
    session.dtmf_received("5")
    clock.advance(0.1)
    session.dtmf_sent("12")
    session.handoff_started(target="billing")
    session.handoff_ended(ok=True)
    await session.aclose()

    call = build_snapshot(
        call_id="c1", kind="sip", direction="inbound", from_="1", to="2", route="r", provider="fake",
        state="ended", worker="w", codec="PCMU", cost=1.0, started=0.0, answered=0.0, ended=1.0,
        end_reason="caller_hung_up", stats={}, session=session, trace_id="ab" * 16,
    )  # fmt: skip
    lines = {line.text: line for line in call.transcript}
    user, first, cut = lines["Hi"], lines["Hello there."], lines["Let me tell you a long story"]
    assert user.start_s == 0.0 and user.end_s == 1.0 and not user.truncated
    assert first.start_s == 1.5 and first.end_s is not None and abs(first.end_s - 1.56) < 1e-9
    assert not first.truncated
    assert cut.truncated and cut.end_s is not None and abs(cut.end_s - 1.86) < 1e-9
    assert call.dtmf == "5"
    assert [(d.digit, d.direction, round(d.at_s or 0, 2)) for d in call.dtmf_events] == [
        ("5", "received", 1.86),
        ("1", "sent", 1.96),
        ("2", "sent", 1.96),
    ]
    assert call.stats.handoffs == 1 and call.stats.barge_ins == 1
    assert call.trace_id == "ab" * 16
    assert began == session.started_at
