"""Live call control of a session: say (after the turn, or cutting the agent), inject, and refusals."""

from __future__ import annotations

import pytest

from gateway.providers.base import AudioReceived, ResponseDone, ResponseStarted
from gateway.session.errors import SessionStateError
from gateway.session.events import BargedIn
from tests.gateway.session.fakes import FakeModel, drained, make_session, pcm_ms, wait_event

SAY = "Say exactly this, then stop: Your order has shipped."


async def test_say_waits_for_the_current_response_then_asks_for_the_text() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    await drained(session, fake)
    session.say("Your order has shipped.")
    await drained(session, fake)
    assert fake.of("create_response") == [], "the agent's current response goes on"
    fake.emit(ResponseDone(response_id="r1", status="completed"))
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("create_response") == [("create_response", SAY)]
    assert fake.of("cancel_response") == []
    await session.aclose()


async def test_say_with_interrupt_cuts_the_agent_like_a_barge_in() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(2000)))
    await drained(session, fake)
    for _ in range(10):
        session.pull_outbound()
    session.say("Your order has shipped.", interrupt=True)
    assert session.pull_outbound() is None, "the agent is silent from the next tick"
    event = await wait_event(session, lambda e: isinstance(e, BargedIn))
    assert event.trigger == "api" and event.cancelled
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert fake.of("truncate") == [("truncate", "i1", 0, 200)]
    fake.emit(ResponseDone(response_id="r1", status="cancelled"))
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("create_response") == [("create_response", SAY)]
    await session.aclose()


async def test_inject_adds_the_message_to_conversation_and_transcript() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    session.inject("The caller is a gold member.", role="system", respond=True)
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("text") == [("text", "The caller is a gold member.", "system")]
    assert fake.sent.index(("text", "The caller is a gold member.", "system")) < fake.sent.index(
        ("create_response", None)
    )
    assert [(e.role, e.text) for e in session.transcript if e.kind == "message"][-1] == (
        "system",
        "The caller is a gold member.",
    )
    session.inject("Noted.", role="user")
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "text" and e[1] == "Noted."])
    assert len(fake.of("create_response")) == 1, "no response asked for without respond"
    await session.aclose()


async def test_say_and_inject_are_refused_unless_the_call_is_active() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    with pytest.raises(SessionStateError, match="cannot say while the call is"):
        session.say("too early")
    await session.start()
    await session.aclose()
    with pytest.raises(SessionStateError, match="cannot inject while the call is ended"):
        session.inject("too late", role="user")
