"""The eight failure paths of a realtime session's lifecycle, on the real public path: a CallSession speaking the
OpenAI adapter to the fake OpenAI server over a real websocket (tests/gateway/session/test_lifecycle.py covers
the same paths against the in-process fake provider, with a fake clock).

1. entry failure                    5. repeated close
2. connect failure after listeners  6. a transition (profile update) failing partway
3. a background task raising or     7. tool output send failing, retried without running the tool twice
   cancelled                        8. concurrent guardrails tripping once
4. cleanup while waiters wait
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from gateway.providers.base import AgentProfile, HistoryItem
from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel, OpenAISession
from gateway.session import (
    CallState,
    EventRingClosedError,
    ProfileUpdateError,
    SessionStartError,
    SessionStateError,
    ToolRegistry,
)
from gateway.session.config import GuardrailConfig
from gateway.session.events import (
    ErrorOccurred,
    GuardrailTripped,
    ProfileUpdated,
    ProfileUpdateFailed,
    Resumed,
    SessionEnded,
    ToolCallFinished,
    ToolCallStarted,
)
from telcodecs.frames import FRAME_SAMPLES, Frame
from tests.e2e.provider_harness import WebhookRequest, WebhookServer
from tests.gateway.session.fakes import DEADLINE, call_tasks, fast_config, of_type
from tests.gateway.session.realpath import (
    RoutedModel,
    events_of,
    openai_model,
    real_session,
    tick_until,
    wait_for,
    wait_record,
)
from tests.gateway.session.test_lifecycle import CountingTool

pytestmark = pytest.mark.timeout(30)


def _caller_turn(session: Any, *, start: int = 0) -> int:
    """One caller turn into the session: 0.6 s of tone, then 0.8 s of silence (the fake's VAD ends the turn)."""
    index = start
    tone = (np.sin(np.arange(FRAME_SAMPLES) * 2 * np.pi * 440 / 24_000) * 6000).astype(np.int16)
    for _ in range(30):
        session.push_inbound(Frame(index=index, pcm=tone))
        index += 1
    for _ in range(40):
        session.push_inbound(Frame(index=index, pcm=np.zeros(FRAME_SAMPLES, dtype=np.int16)))
        index += 1
    return index


async def _all_closed(fake: FakeRealtimeServer) -> None:
    await wait_record(fake, lambda: all(r.ended_at is not None for r in fake.records.values()))


# ------------------------------------------------------------------------------------------- 1. entry


async def test_1_entry_failure_releases_everything() -> None:
    async with FakeRealtimeServer(FakeOptions(session_delay_s=5.0)) as fake:
        model = OpenAIRealtimeModel(OpenAIConfig(url=fake.url, setup_timeout_s=0.2, open_timeout_s=1.0))
        session, control = real_session(model, config=fast_config(connect_attempts=2))
        with pytest.raises(SessionStartError) as info:
            await session.start()
        assert info.value.reason == "provider_unavailable"
        assert session.state is CallState.ENDED and call_tasks() == []
        assert len(fake.records) == 2, "both attempts reached the provider"
        await _all_closed(fake)
        assert control.hang_ups == [], "a call that never started is not hung up from the session"


# ------------------------------------------------------------------------- 2. connect after listeners


class _ClosingModel:
    """Connects for real, then loses the connection after the session attached its listener."""

    def __init__(self, inner: OpenAIRealtimeModel) -> None:
        self._inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities

    async def connect(
        self, profile: AgentProfile, *, history: tuple[HistoryItem, ...] = (), resume_handle: str | None = None
    ) -> OpenAISession:
        session = await self._inner.connect(profile, history=history, resume_handle=resume_handle)
        await session.aclose()
        return session


async def test_2_connect_failure_after_listeners_releases_everything() -> None:
    async with FakeRealtimeServer() as fake:
        profile = AgentProfile(name="greeter", provider="openai", greeting="Hello!")
        session, _ = real_session(_ClosingModel(openai_model(fake.url)), profile=profile)

        async def follow() -> list[str]:
            return [type(r.event).__name__ async for r in session.events.follow()]

        follower = asyncio.create_task(follow())
        with pytest.raises(SessionStartError) as info:
            await session.start()
        assert info.value.reason == "provider_unavailable"
        seen = await asyncio.wait_for(follower, DEADLINE)
        assert seen[-1] == "SessionEnded"
        assert session.state is CallState.ENDED and call_tasks() == []
        await _all_closed(fake)


# ---------------------------------------------------------------------- 3. background task fails


async def test_3_a_tool_that_raises_or_is_cancelled_is_contained() -> None:
    async with FakeRealtimeServer(FakeOptions(mode="tone", reply_ms=200, tool_name="lookup")) as fake:
        tool = CountingTool()
        tool.fail = RuntimeError("database is down")
        session, _ = real_session(openai_model(fake.url), tools=ToolRegistry([tool]))
        await session.start()
        _caller_turn(session)
        error = await wait_for(session, of_type(ErrorOccurred, where="tool lookup"))
        assert isinstance(error, ErrorOccurred) and "database is down" in error.message
        record = fake.record(1)
        await wait_record(fake, lambda: bool(record.tool_outputs))
        assert [json.loads(o["output"]) for o in record.tool_outputs] == [{"error": "lookup failed: RuntimeError"}]
        assert session.state is CallState.ACTIVE
        await session.aclose()
        assert call_tasks() == []

    async with FakeRealtimeServer(FakeOptions(mode="tone", reply_ms=200, tool_name="lookup")) as fake:
        tool = CountingTool()
        tool.block = True
        session, _ = real_session(openai_model(fake.url), tools=ToolRegistry([tool]))
        await session.start()
        _caller_turn(session)
        started = await wait_for(session, lambda e: isinstance(e, ToolCallStarted))
        assert isinstance(started, ToolCallStarted)
        (task,) = [t for t in call_tasks() if t.get_name().endswith(f":tool:lookup:{started.call_id}")]
        task.cancel()
        finished = await wait_for(session, of_type(ToolCallFinished, call_id=started.call_id))
        assert isinstance(finished, ToolCallFinished) and not finished.ok
        record = fake.record(1)
        await wait_record(fake, lambda: bool(record.tool_outputs))
        assert json.loads(record.tool_outputs[0]["output"]) == {"error": "lookup was cancelled"}
        assert session.state is CallState.ACTIVE
        await session.aclose()
        assert call_tasks() == []


# --------------------------------------------------------------------------- 4. waiters at cleanup


async def test_4_cleanup_wakes_every_waiter() -> None:
    async with FakeRealtimeServer() as fake:
        session, _ = real_session(openai_model(fake.url))
        await session.start()

        async def follow() -> int:
            return len([record async for record in session.events.follow()])

        followers = [asyncio.create_task(follow()) for _ in range(3)]
        never = asyncio.create_task(session.events.wait_for(lambda e: False, timeout_s=60))
        since = asyncio.create_task(session.events.wait_since(session.events.last_id + 1000, timeout_s=60))
        ended = asyncio.create_task(session.wait_ended())
        goodbye = asyncio.create_task(session.end_with_goodbye("done", ""))
        await asyncio.wait_for(session.wait_ended(), DEADLINE)
        counts = await asyncio.wait_for(asyncio.gather(*followers), DEADLINE)
        assert all(count >= 3 for count in counts)
        with pytest.raises(EventRingClosedError):
            await asyncio.wait_for(never, DEADLINE)
        assert (await asyncio.wait_for(since, DEADLINE)) == ([], False)
        assert await asyncio.wait_for(ended, DEADLINE) == "done"
        await asyncio.wait_for(goodbye, DEADLINE)
        await _all_closed(fake)
        assert call_tasks() == []


# ------------------------------------------------------------------------------- 5. repeated close


async def test_5_repeated_close_ends_once() -> None:
    async with FakeRealtimeServer() as fake:
        session, _ = real_session(openai_model(fake.url))
        await session.start()
        closers = [asyncio.create_task(session.aclose(f"reason-{i}")) for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*closers), DEADLINE)
        await session.aclose("late")
        assert session.end_reason == "reason-0"
        assert len(events_of(session, SessionEnded)) == 1
        await _all_closed(fake)
        assert len(fake.records) == 1 and call_tasks() == []
        with pytest.raises(SessionStateError):
            await session.start()


# --------------------------------------------------------------------- 6. transition fails partway


async def test_6_a_profile_update_failing_partway_keeps_the_old_agent() -> None:
    async with FakeRealtimeServer() as good, FakeRealtimeServer(FakeOptions(session_delay_s=5.0)) as slow:
        models = {
            "good": openai_model(good.url),
            "slow": OpenAIRealtimeModel(OpenAIConfig(url=slow.url, setup_timeout_s=0.2)),
        }
        routed = RoutedModel(models, default="good")
        session, _ = real_session(routed, profile=AgentProfile(name="first", provider="openai", model="good"))
        await session.start()
        with pytest.raises(ProfileUpdateError):
            await session.update_profile(AgentProfile(name="second", provider="openai", model="slow"))
        failed = await wait_for(session, lambda e: isinstance(e, ProfileUpdateFailed))
        assert isinstance(failed, ProfileUpdateFailed) and failed.name == "second"
        assert session.profile.name == "first" and session.state is CallState.ACTIVE
        await _all_closed(slow)
        # The old connection still carries the caller's audio.
        record = good.record(1)
        before = record.audio_bytes
        _caller_turn(session)
        await wait_record(good, lambda: record.audio_bytes > before)
        # And a later update that works switches over.
        await session.update_profile(AgentProfile(name="third", provider="openai", model="good"))
        updated = await wait_for(session, lambda e: isinstance(e, ProfileUpdated))
        assert isinstance(updated, ProfileUpdated) and updated.name == "third"
        await session.aclose()
        assert call_tasks() == []


# ------------------------------------------------------------- 7. tool output send fails, retried


async def test_7_a_tool_result_whose_connection_died_is_delivered_once_on_the_next() -> None:
    async with FakeRealtimeServer(FakeOptions(mode="tone", reply_ms=200, tool_name="lookup")) as fake:
        tool = CountingTool()
        tool.block = True
        session, _ = real_session(openai_model(fake.url), tools=ToolRegistry([tool]))
        await session.start()
        _caller_turn(session)
        started = await wait_for(session, lambda e: isinstance(e, ToolCallStarted))
        assert isinstance(started, ToolCallStarted)
        await fake.drop(1)  # the connection dies while the tool runs: its output cannot go there
        await wait_for(session, lambda e: isinstance(e, Resumed))
        tool.release.set()
        await wait_record(fake, lambda: 2 in fake.records and bool(fake.record(2).tool_outputs))
        assert fake.record(1).tool_outputs == []
        assert fake.record(2).tool_outputs == [{"call_id": started.call_id, "output": '{"answer": 42}'}]
        assert tool.runs == 1
        # The replayed history carries the call, not its output (delivered once, live).
        replayed = [e["item"] for e in fake.record(2).events if e["type"] == "conversation.item.create"]
        assert [i["type"] for i in replayed].count("function_call_output") == 1
        await session.aclose()
        assert call_tasks() == []


# -------------------------------------------------------------- 8. concurrent guardrails trip once


async def test_8_concurrent_guardrails_trip_once_and_start_one_follow_up() -> None:
    async def flag(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        return 200, {"flagged": "Acme" in request.body["text"], "reason": "moderation says no"}

    transcript = "Sure. Acme Corp card 4111 1111 1111 1111 is on file. Anything else?"
    options = FakeOptions(mode="tone", reply_ms=1000, reply_transcript=transcript)
    async with WebhookServer(flag) as hook, FakeRealtimeServer(options) as fake:
        guardrails = (
            GuardrailConfig(name="moderation", kind="http", url=hook.url, timeout_s=2.0),
            GuardrailConfig(name="no-acme", kind="blocked", phrases=("acme corp",)),
            GuardrailConfig(name="pii", kind="pii"),
        )
        config = fast_config(guardrails=guardrails, guardrail_every_chars=4)
        session, _ = real_session(openai_model(fake.url), config=config)
        await session.start()
        session.inject("What is on file?", role="user", respond=True)
        await hook.wait_requests(1, within=DEADLINE)  # the hook was asked (it flags everything)
        record = fake.record(1)
        await tick_until(session, lambda: len(record.responses) == 2 and bool(events_of(session, GuardrailTripped)))
        await wait_record(fake, lambda: any(e["type"] == "response.done" for e in record.timeline[-3:]))
        (trip,) = events_of(session, GuardrailTripped)
        assert trip.guardrail in ("moderation", "no-acme", "pii")
        creates = [e for e in record.events if e["type"] == "response.create"]
        follow_ups = [
            e for e in record.events if e["type"] == "conversation.item.create" and e["item"]["role"] == "system"
        ]
        assert len(creates) == 2 and len(follow_ups) == 1 and record.cancels <= 1
        assert session.state is CallState.ACTIVE
        await session.aclose()
        assert len(events_of(session, GuardrailTripped)) == 1
        assert call_tasks() == []
