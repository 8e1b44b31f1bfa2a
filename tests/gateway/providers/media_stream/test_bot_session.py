"""The websocket provider against the fake bot, behind a real CallSession whose ticks the test drives: the stream's
opening, caller audio out at 20 ms a message, bot audio paced by the playout, marks answered after their audio was
taken by a tick, clear as a barge-in, garbage survived, the bot's hang-up and drops, and our stop."""

from __future__ import annotations

import base64
import itertools
import logging
import re
from typing import Any

import numpy as np
import pytest

from gateway.providers.base import AgentProfile, BotSpec
from gateway.providers.media_stream.fake_bot import BotCall, FakeBot
from gateway.providers.media_stream.session import (
    BotConfig,
    BotSession,
    WebsocketBotModel,
    redact_url,
    twilio_signature,
)
from gateway.session import CallState
from gateway.session.events import BargedIn, ErrorOccurred, Resumed, SessionEnded, ToolCallFinished, ToolCallStarted
from telcodecs.frames import Frame
from telcodecs.g711 import ulaw_encode
from tests.gateway.session.fakes import fast_config, is_state, make_session, of_type, wait_event

DEADLINE = 5.0
CONTEXT = {"from_number": "+15550100", "to_number": "+15550199", "call_id": "call-1", "direction": "inbound"}


def profile(url: str, *, audio_format: str = "pcmu", **bot: Any) -> AgentProfile:
    return AgentProfile(
        name="bot",
        provider="websocket",
        audio_format=audio_format,  # type: ignore[arg-type]
        bot=BotSpec(url=url, **bot),
        call_context=CONTEXT,
    )


def caller_frame(index: int, codes: bytes) -> Frame:
    return Frame(index=index, pcm=np.zeros(480, dtype=np.int16), g711=codes, g711_law="pcmu")


def codes_of(frames: list[Any]) -> bytes:
    return b"".join(f.g711 for f in frames if f is not None)


def tone_codes(ms: int, *, freq: float = 440.0) -> bytes:
    t = np.arange(ms * 8) / 8000
    return ulaw_encode((8000 * np.sin(2 * np.pi * freq * t)).astype(np.int16))


async def started(bot: FakeBot, **kwargs: Any) -> tuple[Any, BotCall, WebsocketBotModel]:
    model = WebsocketBotModel(BotConfig(**kwargs))
    session, _ = make_session(model, profile=profile(bot.url), config=fast_config())  # type: ignore[arg-type]
    await session.start()
    call = await bot.wait_call(len(bot.calls) - 1 if bot.calls else 0, timeout_s=DEADLINE)
    return session, call, model


async def test_opening_carries_the_call_context_and_caller_audio_flows_20ms_a_message() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot, token="s3cret", headers={"X-Bot-Key": "k"})
        assert [r.message["event"] for r in call.messages[:2]] == ["connected", "start"]
        start = call.start["start"]
        assert start["customParameters"] == CONTEXT
        assert start["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
        assert re.fullmatch(r"MZ[0-9a-f]{32}", start["streamSid"]) and re.fullmatch(r"CA[0-9a-f]{32}", start["callSid"])
        assert call.headers["authorization"] == "Bearer s3cret" and call.headers["x-bot-key"] == "k"
        assert "origin" not in call.headers

        sent = [bytes([i]) * 160 for i in range(10)]
        for i, codes in enumerate(sent):
            session.push_inbound(caller_frame(i, codes))
        await call.wait_for(lambda c: len(c.of("media")) >= 10, timeout_s=DEADLINE)
        media = call.of("media")
        assert call.caller_audio() == b"".join(sent), "a PCMU caller's own codes reach the bot unchanged"
        assert [m["media"]["chunk"] for m in media] == [str(i) for i in range(1, 11)]
        assert [m["media"]["timestamp"] for m in media] == [str(20 * i) for i in range(10)]
        assert [m["sequenceNumber"] for m in media] == [str(i) for i in range(2, 12)]

        session.dtmf_received("7")
        await call.wait_for(lambda c: bool(c.of("dtmf")), timeout_s=DEADLINE)
        assert call.of("dtmf")[0]["dtmf"] == {"track": "inbound_track", "digit": "7"}

        await session.aclose()
        await call.wait_for(lambda c: c.close_code is not None, timeout_s=DEADLINE)
        stop = call.of("stop")
        assert stop and stop[0]["stop"] == {"accountSid": "AC" + "0" * 32, "callSid": start["callSid"]}
        assert call.messages[-1].message["event"] == "stop" and call.close_code == 1000


async def test_bot_audio_is_paced_by_the_playout_and_marks_come_back_after_it_was_taken() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot)
        greeting = tone_codes(1000)
        await call.send_media(greeting, chunk_bytes=320)  # a second of audio at once: faster than real time
        await call.send_mark("greeting-done")
        # Nothing was played yet, so the mark must wait however long the bot waits.
        await _drained(session, call)
        assert call.mark_echoes() == []
        played = [session.pull_outbound(takes_g711=True) for _ in range(49)]
        assert codes_of(played) == greeting[: 49 * 160], "the bot's audio, byte for byte, one frame a tick"
        assert call.mark_echoes() == []
        last = session.pull_outbound(takes_g711=True)
        assert codes_of([last]) == greeting[49 * 160 :]
        await call.wait_for(lambda c: bool(c.mark_echoes()), timeout_s=DEADLINE)
        assert [name for name, _ in call.mark_echoes()] == ["greeting-done"]
        assert session.pull_outbound(takes_g711=True) is None
        # A mark on an empty playout is answered at once.
        await call.send_mark("idle")
        await call.wait_for(lambda c: len(c.mark_echoes()) == 2, timeout_s=DEADLINE)
        await session.aclose()


async def test_clear_cuts_the_playout_at_the_tick_and_answers_pending_marks() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot)
        await call.send_media(tone_codes(2000), chunk_bytes=320)
        await call.send_mark("never-heard")
        await _drained(session, call)
        for _ in range(10):
            assert session.pull_outbound(takes_g711=True) is not None
        await call.send_clear()
        barge = await wait_event(session, of_type(BargedIn, trigger="provider_interrupted"))
        assert isinstance(barge, BargedIn) and barge.items[0].sent_ms == 200
        assert session.pull_outbound(takes_g711=True) is None, "cut in the very next tick"
        await call.wait_for(lambda c: bool(c.mark_echoes()), timeout_s=DEADLINE)
        assert [name for name, _ in call.mark_echoes()] == ["never-heard"]
        # New audio after the clear plays.
        await call.send_media(tone_codes(40, freq=880.0))
        await _drained(session, call)
        assert session.pull_outbound(takes_g711=True) is not None
        await session.aclose()


async def test_garbage_from_the_bot_is_counted_logged_and_survived(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeBot() as bot:
        session, call, _ = await started(bot)
        for raw in ["{oops", '{"event":"media","media":{"payload":"@@"}}', '{"event":"dance"}', b"\x00\x01"]:
            await call.send_raw(raw)
        await call.send_raw('{"event":"dance"}')
        await call.send_media(tone_codes(20))
        await _drained(session, call)
        errors = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, ErrorOccurred)]
        assert [e.error_type for e in errors] == [
            "bot_malformed_json",
            "bot_bad_base64",
            "bot_unknown_event",
            "bot_binary_frame",
            "bot_unknown_event",
            "bot_unknown_event",  # _drained's tag
        ]
        assert session.state is CallState.ACTIVE
        assert session.pull_outbound(takes_g711=True) is not None, "good audio after the garbage still plays"
        warnings = [r.getMessage() for r in caplog.records if "bot message dropped" in r.getMessage()]
        assert len(warnings) == 4, "the first of each kind is a warning, repeats are counted quietly"
        await session.aclose()


async def test_bot_close_1000_hangs_up_after_its_queued_audio() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot)
        await call.send_media(tone_codes(200), chunk_bytes=320)
        await _drained(session, call)
        await call.close(1000)
        tool = await wait_event(session, of_type(ToolCallStarted))
        assert isinstance(tool, ToolCallStarted) and tool.name == "hang_up"
        assert session.state is CallState.ACTIVE, "the queued goodbye plays first"
        stream: BotSession = session._pipe.link.session  # type: ignore[union-attr]
        for i in range(3):  # the caller's audio meanwhile goes nowhere, quietly: no resume, no error
            session.push_inbound(caller_frame(i, b"\xff" * 160))
        await stream.send_audio(b"\xff" * 160)
        assert stream.audio_dropped == 4 and session.stats().errors == 1  # the drained tag's, nothing else
        frames = [session.pull_outbound(takes_g711=True) for _ in range(10)]
        assert all(f is not None for f in frames)
        for _ in range(5):
            session.pull_outbound(takes_g711=True)
        await wait_event(session, of_type(ToolCallFinished, name="hang_up"))
        ended = await wait_event(session, of_type(SessionEnded))
        assert isinstance(ended, SessionEnded) and ended.reason == "agent_hang_up"


async def test_bot_drop_resumes_on_a_new_stream_of_the_same_call() -> None:
    async with FakeBot() as bot:
        session, first, _ = await started(bot)
        await first.close(1011, "restarting")
        await wait_event(session, of_type(Resumed))
        second = await bot.wait_call(1, timeout_s=DEADLINE)
        assert second.start["start"]["callSid"] == first.start["start"]["callSid"]
        assert second.stream_sid != first.stream_sid
        await session.aclose()


async def test_bot_policy_close_ends_the_call() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot)
        await call.close(1008, "unauthorized")
        await wait_event(session, is_state(CallState.ENDED))
        assert session.end_reason == "provider_unavailable"


async def test_l16_wire_audio_with_a_pcm24k_profile() -> None:
    async with FakeBot() as bot:
        model = WebsocketBotModel(BotConfig())
        session, _ = make_session(model, profile=profile(bot.url, audio_format="pcm24k", audio="l16_24k"))  # type: ignore[arg-type]
        await session.start()
        call = await bot.wait_call(timeout_s=DEADLINE)
        assert call.start["start"]["mediaFormat"] == {"encoding": "audio/x-l16", "sampleRate": 24000, "channels": 1}
        pcm = (np.arange(960, dtype=np.int64) % 2000 - 1000).astype("<i2")
        session.push_inbound(Frame(index=0, pcm=pcm[:480]))
        await call.wait_for(lambda c: bool(c.of("media")), timeout_s=DEADLINE)
        assert base64.b64decode(call.of("media")[0]["media"]["payload"]) == pcm[:480].tobytes()
        await call.send_media(pcm.tobytes())
        await _drained(session, call)
        out = [session.pull_outbound() for _ in range(2)]
        assert b"".join(f.to_bytes() for f in out if f is not None) == pcm.tobytes()
        await session.aclose()


async def test_secrets_never_reach_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeBot() as bot:
        secret_url = bot.url.replace("/stream", "/ws/path-token-123")
        model = WebsocketBotModel(BotConfig(token="tok-456", twilio_auth_token="auth-789"))
        session, _ = make_session(model, profile=profile(secret_url))  # type: ignore[arg-type]
        await session.start()
        call = await bot.wait_call(timeout_s=DEADLINE)
        assert call.headers["x-twilio-signature"] == twilio_signature(secret_url, "auth-789")
        assert call.path == "/ws/path-token-123"
        await session.aclose()
    # The gateway's own logs (the websockets library's DEBUG wire log is the operator's to leave off).
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gateway"))
    assert "path-token-123" not in text and "tok-456" not in text and "auth-789" not in text
    assert redact_url(secret_url) in text


async def test_a_bot_that_is_not_there_fails_the_call_start_with_a_redacted_error() -> None:
    model = WebsocketBotModel(BotConfig(open_timeout_s=1.0))
    session, _ = make_session(model, profile=profile("ws://127.0.0.1:9/ws/secret-token"))  # type: ignore[arg-type]
    with pytest.raises(Exception) as raised:
        await session.start()
    assert "secret-token" not in str(raised.value) and "secret-token" not in repr(raised.value.__cause__)


async def test_a_bot_far_ahead_is_refused_past_the_bound() -> None:
    async with FakeBot() as bot:
        session, call, _ = await started(bot, max_queued_s=1.0)
        await call.send_media(tone_codes(3000), chunk_bytes=800)  # 100 ms a message, 3 s ahead
        await session.events.wait_for(of_type(ErrorOccurred, error_type="bot_overflow"), timeout_s=DEADLINE)
        await _drained(session, call)
        stream: BotSession = session._pipe.link.session  # type: ignore[union-attr]
        assert stream.protocol.counters.rejected["overflow"] == 20  # only the first second was queued
        frames = [session.pull_outbound(takes_g711=True) for _ in range(60)]
        assert sum(f is not None for f in frames) == 50
        await session.aclose()


# ------------------------------------------------------------------------------------------------ helpers

_tags = itertools.count(1)


async def _drained(session: Any, call: BotCall) -> None:
    """Wait until the session's listener has handled everything the bot sent so far: the bot sends an unknown
    event as a tag, and its ErrorOccurred comes after everything before it."""
    tag = f"sync-{next(_tags)}"
    await call.send_raw(f'{{"event":"{tag}"}}')
    await wait_event(session, lambda e: isinstance(e, ErrorOccurred) and tag in e.message)
