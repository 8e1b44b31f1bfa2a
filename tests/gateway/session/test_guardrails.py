"""Output guardrails on the session's real path (OpenAI adapter, fake OpenAI server over a websocket): a trip
stops the agent at the next tick, truncates at exactly what was sent, records one ``guardrail.tripped`` and asks
for one follow-up; a hook that fails or is slow is skipped and never holds the tick."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
from gateway.session import CallState
from gateway.session.config import GuardrailConfig
from gateway.session.events import ErrorOccurred, GuardrailTripped
from tests.e2e.provider_harness import WebhookRequest, WebhookServer
from tests.gateway.session.fakes import fast_config
from tests.gateway.session.realpath import events_of, openai_model, real_session, tick_until, wait_for, wait_record

pytestmark = pytest.mark.timeout(30)

WORDS = [f"word{i}" for i in range(20)]
BLOCKED = GuardrailConfig(name="no-acme", kind="blocked", phrases=("acme corp",))


def _reply(at: int, phrase: str) -> str:
    """Twenty words, one per 100 ms audio delta, with ``phrase`` as word ``at``."""
    words = list(WORDS)
    words[at] = phrase
    return " ".join(words)


def _paced(transcript: str, **overrides: Any) -> FakeOptions:
    base: dict[str, Any] = {
        "mode": "tone",
        "reply_ms": 2000,
        "paced": True,
        "chunk_ms": 100,
        "reply_transcript": transcript,
    }
    base.update(overrides)
    return FakeOptions(**base)


async def test_a_blocked_phrase_stops_the_agent_at_the_next_tick_and_truncates_at_what_was_sent() -> None:
    # Each response starts 0.2 s after it is asked for: the follow-up's audio cannot reach the tick that stopped.
    async with FakeRealtimeServer(_paced(_reply(8, "acme-corp acme corp"), reply_delay_s=0.2)) as fake:
        config = fast_config(guardrails=(BLOCKED,), guardrail_every_chars=12)
        session, _ = real_session(openai_model(fake.url), config=config)
        await session.start()
        session.inject("Who makes this?", role="user", respond=True)
        sent_frames = pulls = 0
        stopped = False
        # The media tick, by hand: one frame every 20 ms while the fake streams in real time.
        for _ in range(150):
            frame = session.pull_outbound()
            pulls += 1
            tripped = events_of(session, GuardrailTripped)
            if tripped:
                assert frame is None, "the tick after the trip sent none of the cut audio"
                stopped = True
                break
            if frame is not None:
                sent_frames += 1
            await asyncio.sleep(0.02)
        assert stopped, "the guardrail never tripped"
        (event,) = tripped
        assert (event.guardrail, event.reason) == ("no-acme", "blocked phrase 'acme corp'")
        ((item),) = event.items
        assert item.sent_ms == 20 * sent_frames and 0 < item.sent_ms < item.received_ms
        assert event.cancelled and event.truncated
        assert event.stopped_at is not None and event.stopped_at - event.received_at <= 0.040
        assert event.stopped_frame == pulls - 1, "recorded by the tick that stopped playout"

        record = fake.record(1)
        await wait_record(fake, lambda: len(record.responses) == 2)
        assert record.truncations == [{"item_id": item.item_id, "audio_end_ms": item.sent_ms}]
        assert record.cancels == 1
        follow_ups = [
            e for e in record.events if e["type"] == "conversation.item.create" and e["item"]["role"] == "system"
        ]
        assert len(follow_ups) == 1 and "no-acme" in follow_ups[0]["item"]["content"][0]["text"]
        assert [e["type"] for e in record.events].count("response.create") == 2  # the inject's and the follow-up
        assert session.state is CallState.ACTIVE
        await session.aclose()
    assert len(events_of(session, GuardrailTripped)) == 1


@pytest.mark.parametrize("failure", ["http_500", "bad_body", "timeout", "unreachable"])
async def test_a_failing_moderation_hook_is_logged_and_skipped(failure: str) -> None:
    async def answer(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        if failure == "timeout":
            await asyncio.Event().wait()
        if failure == "bad_body":
            return 200, {"verdict": "fine"}
        return 500, {"detail": "moderation is down"}

    async with WebhookServer(answer) as hook, FakeRealtimeServer(_paced("all fine here.", paced=False)) as fake:
        url = "http://127.0.0.1:9/moderate" if failure == "unreachable" else hook.url
        moderation = GuardrailConfig(name="moderation", kind="http", url=url, timeout_s=0.3)
        session, _ = real_session(openai_model(fake.url), config=fast_config(guardrails=(moderation,)))
        await session.start()
        session.inject("Hello", role="user", respond=True)
        error = await wait_for(session, lambda e: isinstance(e, ErrorOccurred) and e.where == "guardrail moderation")
        assert isinstance(error, ErrorOccurred)
        assert error.error_type in ("GuardrailError", "ConnectError"), error
        assert session.state is CallState.ACTIVE and not events_of(session, GuardrailTripped)
        await session.aclose()


async def test_a_slow_hook_never_holds_the_tick_and_its_late_verdict_still_trips_once() -> None:
    release = asyncio.Event()

    async def answer(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        await release.wait()
        return 200, {"flagged": "risky" in request.body["text"], "reason": "unsafe advice"}

    async with WebhookServer(answer) as hook, FakeRealtimeServer(_paced(_reply(3, "risky"))) as fake:
        moderation = GuardrailConfig(name="moderation", kind="http", url=hook.url, timeout_s=5.0)
        config = fast_config(guardrails=(moderation,), guardrail_every_chars=6)
        session, _ = real_session(openai_model(fake.url), config=config)
        await session.start()
        session.inject("Hello", role="user", respond=True)
        await hook.wait_requests(1, within=5.0)
        played = 0
        for _ in range(10):  # ticks go on while the hook holds its answer
            played += session.pull_outbound() is not None
            await asyncio.sleep(0.02)
        assert played >= 5
        assert len(hook.requests) == 1, "check points reached meanwhile wait for the request in flight"
        release.set()
        await tick_until(session, lambda: bool(events_of(session, GuardrailTripped)))  # recorded by a tick
        (event,) = events_of(session, GuardrailTripped)
        assert event.reason == "unsafe advice" and event.stopped_at is not None
        await session.aclose()
    assert len(events_of(session, GuardrailTripped)) == 1


async def test_a_follow_up_that_trips_again_is_cut_without_another_follow_up() -> None:
    async def flag_everything(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        return 200, {"flagged": True, "reason": "no"}

    async with WebhookServer(flag_everything) as hook, FakeRealtimeServer(_paced("hello there.", paced=False)) as fake:
        moderation = GuardrailConfig(name="moderation", kind="http", url=hook.url, timeout_s=2.0)
        session, _ = real_session(openai_model(fake.url), config=fast_config(guardrails=(moderation,)))
        await session.start()
        session.inject("Hello", role="user", respond=True)
        await tick_until(session, lambda: len(events_of(session, GuardrailTripped)) == 2)
        first, second = events_of(session, GuardrailTripped)
        assert first.response_id != second.response_id
        assert (first.followed_up, second.followed_up) == (True, False)
        record = fake.record(1)
        creates = [e for e in record.events if e["type"] == "response.create"]
        assert len(creates) == 2, "the inject's response and one follow-up: no loop"
        await session.aclose()


async def test_each_check_reads_the_new_text_and_finds_a_phrase_split_across_check_points() -> None:
    from gateway.session.guardrails import Guardrails, Trip
    from gateway.session.tasks import TaskOwner

    trips: list[Trip] = []
    errors: list[str] = []
    guardrails = Guardrails(
        (BLOCKED, GuardrailConfig(name="pii", kind="pii")),
        every_chars=40,
        call_id="c1",
        tasks=TaskOwner(prefix="call-c1", on_error=lambda where, exc: errors.append(where), on_critical=lambda: None),
        clock=lambda: 1.0,
        on_trip=trips.append,
        on_error=lambda where, exc: errors.append(where),
    )
    filler = "and then we talked about the weather for a while. " * 20  # 1000 characters, checked as they come
    for at in range(0, len(filler), 7):
        guardrails.feed(response_id="r1", item_id="i1", text=filler[at : at + 7], final=False)
    assert trips == []
    # The phrase straddles a check point: "... Acme" is checked first, then " Corp." arrives.
    guardrails.feed(response_id="r1", item_id="i1", text="x" * 33 + " Acme", final=False)
    assert trips == []
    guardrails.feed(response_id="r1", item_id="i1", text=" Corp.", final=False)
    assert [(t.guardrail, t.response_id) for t in trips] == [("no-acme", "r1")]
    guardrails.feed(response_id="r1", item_id="i1", text=" Card 4111 1111 1111 1111.", final=False)
    assert len(trips) == 1, "one trip per response"
    # Spoken digits split over deltas in a new response.
    for word in [
        "my",
        "card",
        "is",
        "four",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one",
        "one.",
    ]:
        guardrails.feed(response_id="r2", item_id="i2", text=word + " ", final=False)
    assert [t.guardrail for t in trips] == ["no-acme", "pii"] and errors == []
    await guardrails.aclose()
