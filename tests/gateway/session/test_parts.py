"""The session's synchronous parts: event ring, state table, config validation, playout accounting, VAD,
transcript replay."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.session import CallState, InvalidTransitionError, LocalVadConfig, SessionConfig, SessionConfigError
from gateway.session.events import EventRing, NoticeReceived
from gateway.session.playout import PlayoutBuffer
from gateway.session.rotation import RotationPlan
from gateway.session.state import TRANSITIONS, check_transition
from gateway.session.transcript import Transcript
from gateway.session.vad import EnergyVad
from tests.gateway.session.fakes import FakeClock, pcm_ms

# ------------------------------------------------------------------------------------------- ring


def _notice(n: int) -> NoticeReceived:
    return NoticeReceived(code=str(n), message="")


def test_ring_ids_increase_and_gap_is_reported_when_events_fell_out() -> None:
    clock = FakeClock()
    ring = EventRing(3, clock)
    for n in range(5):
        clock.advance(1)
        ring.append(_notice(n))
    records, gap = ring.events_since(0)
    assert [r.id for r in records] == [3, 4, 5] and gap
    assert [r.event.code for r in records] == ["2", "3", "4"]  # type: ignore[attr-defined]
    assert records[0].at == 1003.0
    assert ring.events_since(2) == (records, False)
    assert ring.events_since(4) == (records[2:], False)
    assert ring.events_since(5) == ([], False)


async def test_ring_wait_since_returns_new_events_or_times_out() -> None:
    ring = EventRing(10, FakeClock())
    waiter = asyncio.create_task(ring.wait_since(0, timeout_s=5))
    await asyncio.sleep(0)
    ring.append(_notice(1))
    records, gap = await asyncio.wait_for(waiter, 5)
    assert [r.id for r in records] == [1] and not gap
    with pytest.raises(TimeoutError):
        await ring.wait_since(1, timeout_s=0.01)


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=30), st.integers(1, 8))
def test_ring_events_since_property(reads: list[int], capacity: int) -> None:
    ring = EventRing(capacity, FakeClock())
    for n in range(25):
        ring.append(_notice(n))
    for last in reads:
        records, gap = ring.events_since(last)
        expected = [i for i in range(last + 1, 26) if i > 25 - capacity]
        assert [r.id for r in records] == expected
        assert gap == (last < 25 - capacity)


# ------------------------------------------------------------------------------------------ state


def test_state_table() -> None:
    allowed = {(old, new) for old, news in TRANSITIONS.items() for new in news}
    for old, new in itertools.product(CallState, CallState):
        if (old, new) in allowed:
            check_transition(old, new)
        else:
            with pytest.raises(InvalidTransitionError):
                check_transition(old, new)
    assert (CallState.RESUMING, CallState.ACTIVE) in allowed
    assert not TRANSITIONS[CallState.ENDED]


# ----------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "fields",
    [
        {"hold_buffer_s": 0},
        {"hold_buffer_s": float("nan")},
        {"inbound_chunk_ms": 30},
        {"inbound_chunk_ms": 60, "inbound_max_batch_ms": 40},
        {"inbound_quiet_chunk_ms": 50},
        {"inbound_quiet_after_ms": 0},
        {"resume_attempts": 0},
        {"resume_backoff_base_s": 2.0, "resume_backoff_max_s": 1.0},
        {"tool_grace_s": 5.0, "background_timeout_s": 4.0},
        {"apology_audio": b"\x00"},
        {"dtmf_template": "pressed"},
        {"background_slots": 0},
    ],
)
def test_config_rejects_bad_values(fields: dict[str, object]) -> None:
    with pytest.raises(SessionConfigError):
        SessionConfig(**fields)  # type: ignore[arg-type]


def test_config_is_frozen_and_derives_values() -> None:
    config = SessionConfig(hold_buffer_s=10.0, resume_backoff_base_s=0.25, resume_backoff_max_s=1.0)
    assert config.hold_frames == 500
    assert [config.backoff_s(n) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 1.0]
    with pytest.raises(AttributeError):
        config.hold_buffer_s = 1.0  # type: ignore[misc]
    with pytest.raises(SessionConfigError):
        LocalVadConfig(start_ms=30)


@pytest.mark.parametrize(
    ("fields", "frames"),
    [
        ({}, 5),
        ({"inbound_chunk_ms": 160}, 8),  # never smaller than the chunk
        ({"inbound_max_batch_ms": 60}, 3),  # never larger than a batch
        ({"inbound_quiet_chunk_ms": 20}, 1),  # off
    ],
)
def test_the_quiet_chunk_stays_between_the_chunk_and_the_batch(fields: dict[str, int], frames: int) -> None:
    assert SessionConfig(**fields).quiet_chunk_frames == frames  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- playout


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=12),
    pulls=st.integers(min_value=0, max_value=60),
    done=st.booleans(),
)
def test_playout_frames_are_the_audio_and_sent_never_exceeds_received(sizes: list[int], pulls: int, done: bool) -> None:
    audio = pcm_ms(sum(sizes) // 48 + 1)[: sum(sizes) // 2 * 2]
    buffer = PlayoutBuffer()
    at = 0
    for size in sizes:
        chunk = audio[at : at + size]
        at += size
        if chunk:
            buffer.add(response_id="r", item_id="i", content_index=0, pcm=chunk)
    if done:
        buffer.finish_item(response_id="r", item_id="i")
    out = bytearray()
    item = buffer.item("i", response_id="r")
    for _ in range(pulls):
        popped = buffer.pop()
        if popped is None:
            break
        out += popped[0].tobytes()
        item = popped[1]
    if item is None:
        assert pulls == 0 or not audio
        return
    real = min(len(out), len(audio)) // 2 * 2
    assert bytes(out[:real]) == audio[:real], "frames carry the provider's bytes in order"
    assert not any(out[real:]), "anything past the audio is padding"
    assert item.sent_samples == real // 2
    assert item.sent_ms <= item.received_ms
    assert item.received_ms == len(audio) // 48


def test_playout_interrupt_reports_items_and_drops_later_deltas() -> None:
    buffer = PlayoutBuffer()
    buffer.add(response_id="r", item_id="a", content_index=0, pcm=pcm_ms(100))
    buffer.add(response_id="r", item_id="b", content_index=0, pcm=pcm_ms(100))
    for _ in range(6):
        buffer.pop()
    interrupted = buffer.interrupt()
    assert [(i.item_id, i.sent_ms, i.received_ms) for i in interrupted] == [("b", 20, 100)]
    assert not buffer.playing
    assert not buffer.add(response_id="r", item_id="b", content_index=0, pcm=pcm_ms(20))
    assert buffer.add(response_id="r2", item_id="c", content_index=0, pcm=pcm_ms(20))


# -------------------------------------------------------------------------------------------- VAD


def test_energy_vad_start_and_hangover() -> None:
    vad = EnergyVad(LocalVadConfig(threshold_dbfs=-30.0, start_ms=60, hangover_ms=100))
    loud = np.full(480, 10_000, dtype=np.int16)
    quiet = np.zeros(480, dtype=np.int16)
    assert [vad.feed(loud) for _ in range(3)] == [None, None, "started"]
    assert [vad.feed(quiet) for _ in range(5)] == [None, None, None, None, "stopped"]
    assert not vad.speaking


# ------------------------------------------------------------------------------------- transcript


def test_transcript_keeps_conversation_order_and_replays_history() -> None:
    transcript = Transcript(FakeClock())
    transcript.placeholder("user", "u1")  # speech started; its text arrives after the reply began
    transcript.speech("assistant", "a1", "Hel", final=False)
    transcript.speech("assistant", "a1", "lo", final=False)
    transcript.speech("user", "u1", "Hi there", final=True)
    transcript.function_call("t1", "lookup", '{"q": 1}')
    transcript.function_call("t1", "lookup", '{"q": 1}')
    transcript.function_output("t1", '{"a": 2}')
    transcript.function_output("t1", '{"a": 2}')
    transcript.placeholder("user", "u2")  # never got text: not replayed
    history = transcript.history(resume_instruction="continue")
    assert [(h.kind, h.role, h.text, h.call_id) for h in history] == [
        ("message", "user", "Hi there", ""),
        ("message", "assistant", "Hello", ""),
        ("function_call", "user", "", "t1"),
        ("function_call_output", "user", "", "t1"),
        ("message", "system", "continue", ""),
    ]
    assert history[2].arguments == '{"q": 1}' and history[3].output == '{"a": 2}'
    assert transcript.entries()[1].final is False


# --------------------------------------------------------------------------------------- rotation


def test_rotation_plan_waits_for_a_gap_until_its_deadline() -> None:
    config = SessionConfig(rotation_margin_s=10.0, rotation_gap_wait_s=30.0, expiring_safety_s=5.0)
    plan = RotationPlan(config, max_connection_s=100.0)
    plan.connection_opened(0.0)
    assert plan.next_at == 90.0
    assert plan.due(89.9, between_turns=True) is None
    assert plan.due(94.9, between_turns=False) is None
    assert plan.due(95.0, between_turns=False) == "rotation", "forced 5 s before the connection's end"
    assert plan.due(96.0, between_turns=True) is None, "consumed"
    plan.connection_opened(100.0)
    assert plan.due(190.0, between_turns=True) == "rotation"


def test_rotation_plan_on_expiry_notice_and_unknown_life() -> None:
    config = SessionConfig(expiring_safety_s=5.0)
    plan = RotationPlan(config, max_connection_s=None)
    plan.connection_opened(0.0)
    assert plan.due(1e9, between_turns=True) is None
    plan.expiring(10.0, 50.0)
    assert plan.due(10.0, between_turns=False) is None
    assert plan.due(54.9, between_turns=False) is None
    assert plan.due(55.0, between_turns=False) == "expiring"
    plan.expiring(60.0, 2.0)
    plan.cancel()
    assert plan.due(100.0, between_turns=True) is None
