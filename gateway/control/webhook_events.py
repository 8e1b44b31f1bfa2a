"""What the event webhooks send, and from what: the one table mapping the gateway's own events to webhook events.

Two sources feed the webhooks. The control plane's event stream (what :class:`gateway.control.plane.ControlPlane`
publishes: ``call.started``, ``call.updated``, and the events of parts other than the plane's call tracking) gives
the live events; the ended call's record gives ``call.ended`` and what the record holds whole (the transcript, the
tool calls, the recording), written in the record's own transaction. :data:`EVENT_SOURCES` says which source
becomes which webhook event; adjust it there and nowhere else.

Each event has a ``dedupe_key``, unique per call and endpoint in the outbox: the same event offered twice (a
second end of a call, two sources of one fact) is sent once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from gateway.fleet.models import CallSnapshot

WebhookEventType = Literal[
    "call.started",
    "call.answered",
    "call.ended",
    "call.transcript",
    "call.recording_ready",
    "agent.handoff",
    "call.referred",
    "guardrail.tripped",
    "tool.called",
    "call.transfer_started",
    "call.transferred",
    "call.transfer_failed",
]
WEBHOOK_EVENT_TYPES: tuple[WebhookEventType, ...] = get_args(WebhookEventType)

# Source -> webhook event. "stream:" sources are event types on the plane's event stream ("call.answered" is
# derived: the first snapshot of a call that has an answer time); "record:" sources are parts of an ended call's
# record. call.recording_ready is read from the record (written in the transaction after call.ended, so it
# always follows it), not from the stream's event of the same name, which can reach the outbox first.
EVENT_SOURCES: dict[str, WebhookEventType] = {
    "stream:call.started": "call.started",
    "stream:call.answered": "call.answered",
    "stream:agent.handed_off": "agent.handoff",
    "stream:agent.handoff": "agent.handoff",
    "stream:call.referred": "call.referred",
    "stream:guardrail.tripped": "guardrail.tripped",
    "stream:call.transfer_started": "call.transfer_started",
    "stream:call.transferred": "call.transferred",
    "stream:call.transfer_failed": "call.transfer_failed",
    "record:ended": "call.ended",
    "record:transcript": "call.transcript",
    "record:tools": "tool.called",
    "record:recording": "call.recording_ready",
}

# Events that happen once per call: their dedupe key is their type. Others are keyed by what tells them apart.
_ONCE_PER_CALL = frozenset({"call.started", "call.answered", "call.ended", "call.transcript", "call.recording_ready"})

# The call fields every call.* event carries.
_SUMMARY_FIELDS = (
    "id",
    "direction",
    "kind",
    "from",
    "to",
    "trunk",
    "route",
    "provider",
    "state",
    "worker",
    "started",
    "answered",
    "ended",
    "duration_s",
    "end_reason",
    "context",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookEvent:
    """One event to send to every endpoint subscribed to its type."""

    type: WebhookEventType
    call_id: str
    dedupe_key: str
    time: float
    data: dict[str, Any]


def call_summary(call: dict[str, Any]) -> dict[str, Any]:
    """The call as a webhook shows it (the wire names: ``from``, ``to``); ``call_id`` is its id."""
    summary = {key: call.get(key) for key in _SUMMARY_FIELDS}
    summary["call_id"] = summary.pop("id")
    return summary


def _call_id_of(data: dict[str, Any]) -> str:
    for key in ("call_id", "id"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    call = data.get("call")
    if isinstance(call, dict):
        return _call_id_of(call)
    return ""


def from_stream(
    event_type: str, data: dict[str, Any], time: float, *, event_id: int, answered_known: bool
) -> list[WebhookEvent]:
    """The webhook events of one event of the plane's stream.

    ``answered_known``: the call's ``call.answered`` was already made (the caller remembers per call); a
    ``call.started`` or ``call.updated`` with an answer time otherwise makes it.
    """
    events: list[WebhookEvent] = []
    if event_type in ("call.started", "call.updated"):
        call_id = _call_id_of(data)
        if not call_id:
            return []
        if event_type == "call.started" and data.get("state") != "ended":
            kind = EVENT_SOURCES.get("stream:call.started")
            if kind is not None:
                events.append(
                    WebhookEvent(type=kind, call_id=call_id, dedupe_key=kind, time=time, data=call_summary(data))
                )
        answered = EVENT_SOURCES.get("stream:call.answered")
        if answered is not None and data.get("answered") is not None and not answered_known:
            events.append(
                WebhookEvent(type=answered, call_id=call_id, dedupe_key=answered, time=time, data=call_summary(data))
            )
        return events
    kind = EVENT_SOURCES.get(f"stream:{event_type}")
    if kind is None:
        return []
    call_id = _call_id_of(data)
    if not call_id:
        return []
    # Several per call: told apart by the stream's event id and time (ids of an in-memory store restart at 1).
    key = kind if kind in _ONCE_PER_CALL else f"{kind}:{event_id}:{time:.6f}"
    if kind.startswith("call.transfer"):  # the stream has the whole call: its summary and its transfer line
        return [
            WebhookEvent(
                type=kind,
                call_id=call_id,
                dedupe_key=key,
                time=time,
                data={**call_summary(data), "transfer": data.get("transfer")},
            )
        ]
    return [WebhookEvent(type=kind, call_id=call_id, dedupe_key=key, time=time, data={"call_id": call_id, **data})]


def ended_summary(call: CallSnapshot, profile: str) -> dict[str, Any]:
    """``call.ended``'s data: the call, its end reason and figures, what its record holds (counts)."""
    wire = call.model_dump(mode="json", by_alias=True, exclude={"transcript", "tools"})
    summary = call_summary(wire)
    summary["profile"] = profile
    summary["stats"] = call.stats.model_dump(mode="json", exclude={"level_history", "level_dbfs"})
    summary["dtmf"] = call.dtmf
    summary["transcript_items"] = len(call.transcript)
    summary["tool_calls"] = len(call.tools)
    summary["recording"] = _recording(call)
    return summary


def _recording(call: CallSnapshot) -> dict[str, Any] | None:
    # The recordings helper adds CallSnapshot.recording (path, format, channels, sample_rate, bytes, duration_s).
    recording = getattr(call, "recording", None)
    if recording is None:
        return None
    if hasattr(recording, "model_dump"):
        dumped: dict[str, Any] = recording.model_dump(mode="json")
        return dumped
    return dict(recording) if isinstance(recording, dict) else None


def from_record(call: CallSnapshot, profile: str) -> list[WebhookEvent]:
    """The webhook events of an ended call's record, in the order they are sent."""
    at = call.ended if call.ended is not None else 0.0
    events: list[WebhookEvent] = []
    kind = EVENT_SOURCES.get("record:transcript")
    if kind is not None and call.transcript:
        items = [line.model_dump(mode="json") for line in call.transcript]
        events.append(
            WebhookEvent(
                type=kind, call_id=call.id, dedupe_key=kind, time=at, data={"call_id": call.id, "items": items}
            )
        )
    kind = EVENT_SOURCES.get("record:tools")
    if kind is not None:
        for seq, tool in enumerate(call.tools):
            data = {"call_id": call.id, "seq": seq, **tool.model_dump(mode="json")}
            events.append(WebhookEvent(type=kind, call_id=call.id, dedupe_key=f"{kind}:{seq}", time=at, data=data))
    kind = EVENT_SOURCES.get("record:ended")
    if kind is not None:
        events.append(
            WebhookEvent(type=kind, call_id=call.id, dedupe_key=kind, time=at, data=ended_summary(call, profile))
        )
    kind = EVENT_SOURCES.get("record:recording")
    recording = _recording(call)
    if kind is not None and recording is not None and recording.get("bytes"):  # finished by its worker
        events.append(
            WebhookEvent(
                type=kind, call_id=call.id, dedupe_key=kind, time=at, data={"call_id": call.id, "recording": recording}
            )
        )
    return events
