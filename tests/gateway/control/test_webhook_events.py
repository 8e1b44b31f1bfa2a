"""The mapping of the gateway's events to webhook events, with synthetic events: the plane's stream (including the
sources other parts are adding: agent.handed_off, guardrail.tripped, a recording event) and an ended call's record."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.control.config import ConfigError
from gateway.control.webhook_events import EVENT_SOURCES, WEBHOOK_EVENT_TYPES, from_record, from_stream
from gateway.control.webhooks import Endpoint, EventWebhookSettings, WebhookFeed, backoff_s, body_of, endpoints_of
from gateway.fleet.models import RecordingModel
from tests.gateway.control.conftest import make_config
from tests.gateway.records.conftest import ended_call

CALL = {"id": "c-1", "direction": "inbound", "kind": "sip", "from": "+1555", "to": "+1666", "state": "ringing"}


def _stream(event_type: str, data: dict[str, Any], *, answered_known: bool = False, event_id: int = 7) -> list[Any]:
    return from_stream(event_type, data, 1_767_225_600.0, event_id=event_id, answered_known=answered_known)


def test_every_mapped_source_names_a_webhook_event() -> None:
    assert set(EVENT_SOURCES.values()) <= set(WEBHOOK_EVENT_TYPES)
    assert set(WEBHOOK_EVENT_TYPES) <= set(EVENT_SOURCES.values())  # every webhook event has a source


def test_call_started_then_answered_once_from_the_plane_stream() -> None:
    started = _stream("call.started", CALL)
    assert [(e.type, e.call_id, e.dedupe_key) for e in started] == [("call.started", "c-1", "call.started")]
    assert started[0].data["call_id"] == "c-1" and started[0].data["from"] == "+1555"
    assert started[0].data["trunk"] is None  # a call of no trunk (or an older worker's, which does not say)
    (via,) = _stream("call.started", {**CALL, "trunk": "carrier_a"})
    assert via.data["trunk"] == "carrier_a"
    assert _stream("call.updated", CALL) == []  # not answered yet
    answered = {**CALL, "state": "active", "answered": 1_767_225_601.0}
    (event,) = _stream("call.updated", answered)
    assert event.type == "call.answered" and event.data["answered"] == 1_767_225_601.0
    assert _stream("call.updated", answered, answered_known=True) == []
    # A call first seen answered (a plane restart) gets both, started first.
    assert [e.type for e in _stream("call.started", answered)] == ["call.started", "call.answered"]
    # The plane's call.ended is not mapped: the record's is (in the record's transaction).
    assert _stream("call.ended", {**CALL, "state": "ended"}) == []


def test_events_other_helpers_add_are_mapped_from_their_names() -> None:
    (handoff,) = _stream("agent.handed_off", {"call_id": "c-1", "from_profile": "a", "to_profile": "b"})
    assert handoff.type == "agent.handoff" and handoff.data["to_profile"] == "b"
    assert handoff.dedupe_key == "agent.handoff:7:1767225600.000000"  # several per call: the stream's id and time
    (tripped,) = _stream("guardrail.tripped", {"call": {"id": "c-2"}, "guardrail": "pii"}, event_id=9)
    assert (
        tripped.type == "guardrail.tripped"
        and tripped.call_id == "c-2"
        and tripped.dedupe_key.startswith("guardrail.tripped:9:")
    )
    transfer = {"id": "wt-1", "caller_leg": "c-1", "human_leg": "c-9", "state": "bridged"}
    (transferred,) = _stream("call.transferred", {**CALL, "transcript": [], "transfer": transfer})
    assert transferred.type == "call.transferred" and transferred.call_id == "c-1"
    assert transferred.data["transfer"] == transfer and "transcript" not in transferred.data
    # The stream's call.recording_ready is not mapped: the record's is, after call.ended (see below).
    recording = {"call_id": "c-1", "recording": {"path": "2026-12-07/c-1.wav", "format": "wav", "bytes": 44}}
    assert _stream("call.recording_ready", recording) == []
    assert _stream("worker.lost", {"id": "w"}) == [] and _stream("guardrail.tripped", {"x": 1}) == []


def test_a_finished_recording_is_announced_after_the_end_and_only_then() -> None:
    finished = RecordingModel(path="2026-12-07/c-9.wav", format="wav", channels=2, sample_rate=16000, bytes=64_044)
    call = ended_call("c-9", end_reason="caller_hangup").model_copy(update={"recording": finished})
    events = from_record(call, "support")
    assert [e.type for e in events][-2:] == ["call.ended", "call.recording_ready"]
    assert events[-1].data["recording"]["bytes"] == 64_044
    unfinished = finished.model_copy(update={"bytes": 0})  # a worker lost mid-call: its file was never closed
    lost = ended_call("c-8", end_reason="worker_lost").model_copy(update={"recording": unfinished})
    assert "call.recording_ready" not in [e.type for e in from_record(lost, "support")]


def test_an_ended_record_gives_transcript_tools_end_in_order() -> None:
    call = ended_call("c-9", end_reason="agent_hangup")
    events = from_record(call, "support")
    assert [e.type for e in events] == ["call.transcript", "tool.called", "call.ended"]
    transcript, tool, ended = events
    assert transcript.data["items"][0]["text"] == "Hi, how can I help?"
    assert transcript.data["items"][2]["truncated"] is True
    assert tool.data["name"] == "order_status" and tool.data["result"] == '{"status": "shipped"}'
    assert tool.dedupe_key == "tool.called:0"
    assert ended.data["end_reason"] == "agent_hangup" and ended.data["profile"] == "support"
    assert ended.data["duration_s"] == 30.0 and ended.data["stats"]["mos"] == 4.31
    assert (ended.data["direction"], ended.data["trunk"]) == ("inbound", "carrier_a")
    assert ended.data["transcript_items"] == 3 and ended.data["tool_calls"] == 1 and ended.data["recording"] is None
    envelope = orjson.loads(body_of(ended))
    assert envelope["type"] == "call.ended" and envelope["timestamp"].endswith("Z") and envelope["data"]["call_id"]


def test_the_feed_sends_each_endpoint_only_what_it_subscribed_to() -> None:
    endpoints = [
        Endpoint("all", "http://127.0.0.1:1/a", frozenset(WEBHOOK_EVENT_TYPES), None),
        Endpoint("ends", "http://127.0.0.1:1/b", frozenset({"call.ended"}), None),
    ]
    feed = WebhookFeed(endpoints, capacity=2)
    feed.offer("call.started", CALL, 1.0)
    feed.offer("call.updated", {**CALL, "answered": 2.0}, 2.0)
    feed.offer("call.updated", {**CALL, "answered": 2.0}, 3.0)  # answered already made: nothing
    assert feed.backlog == 2 and feed.dropped == 0
    feed.offer("call.started", {**CALL, "id": "c-3"}, 4.0)  # the buffer holds 2: the oldest goes, counted
    assert feed.backlog == 2 and feed.dropped == 1
    rows = feed.ended_events(ended_call("c-9"), "support")
    assert sorted((row.endpoint, row.event_type) for row in rows) == [
        ("all", "call.ended"),
        ("all", "call.transcript"),
        ("all", "tool.called"),
        ("ends", "call.ended"),
    ]
    assert len({row.msg_id for row in rows}) == 4


def test_endpoints_come_from_the_routes_file_and_the_settings() -> None:
    config = make_config(
        webhooks=[
            {"name": "crm", "url": "https://crm.example/hooks", "events": ["call.ended"], "secret": "own-secret"},
            {"name": "all", "url": "http://127.0.0.1:9/hooks"},
        ]
    )
    settings = EventWebhookSettings(url="http://127.0.0.1:9/env", events="call.started, call.ended")
    crm, everything, default = endpoints_of(config, settings, "the-shared-secret")
    assert (crm.name, crm.events) == ("crm", frozenset({"call.ended"}))
    assert crm.signer is not None and crm.signer.secret == "own-secret"
    assert everything.events == frozenset(WEBHOOK_EVENT_TYPES)
    assert everything.signer is not None and everything.signer.secret == "the-shared-secret"
    assert default.name == "default" and default.events == frozenset({"call.started", "call.ended"})
    assert endpoints_of(make_config(), EventWebhookSettings(), None) == ()
    with pytest.raises(ValidationError, match=r"names call\.nope: the events are call\.started"):
        EventWebhookSettings(url="http://127.0.0.1:9/", events="call.ended,call.nope")


@pytest.mark.parametrize(
    ("webhooks", "problem"),
    [
        ([{"name": "a", "url": "ftp://x"}], "webhooks[0].url"),
        ([{"name": "a", "url": "http://x", "events": ["call.nope"]}], "webhooks[0].events[0]"),
        ([{"name": "a", "url": "http://x", "events": []}], "webhooks[0].events"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], "duplicate endpoint name 'a'"),
        ([{"name": "a b", "url": "http://x"}], "webhooks[0].name"),
    ],
)
def test_a_bad_subscription_fails_the_load_naming_it(webhooks: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        make_config(webhooks=webhooks)


def test_backoff_doubles_from_the_minimum_up_to_the_maximum() -> None:
    settings = EventWebhookSettings(backoff_min_s=1.0, backoff_max_s=300.0)
    assert [backoff_s(n, settings) for n in (1, 2, 3, 4, 9, 10, 500)] == [1.0, 2.0, 4.0, 8.0, 256.0, 300.0, 300.0]
    with pytest.raises(ValidationError, match="url"):
        EventWebhookSettings(url="ftp://example.com/hooks")
