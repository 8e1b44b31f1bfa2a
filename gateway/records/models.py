"""The record of an ended call as the history API returns it, and its mapping to and from the tables.

A :class:`CallRecord` is the call's last snapshot (the fleet contract's :class:`CallSnapshot`, so a history item
reads like a live call) plus what the plane knows of it: the agent profile its route gave it and
where its recording lies (its context, from the snapshot, is kept as JSON).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from gateway.fleet.models import CallSnapshot, CallStats, ToolCallLine, TranscriptLine

__all__ = ["CallRecord", "ToolCallLine", "call_row", "record_from_rows", "tool_rows", "transcript_rows"]


class CallRecord(CallSnapshot):
    """One ended call, whole (the transcript and tool calls only on ``GET /v1/calls/{id}``)."""

    profile: str = Field(default="", description="The agent profile the call's route gave it")
    recording_path: str | None = Field(default=None, description="Where the call's recording lies (none yet)")


def call_row(call: CallSnapshot, *, profile: str, written_at: float | None = None) -> dict[str, Any]:
    """The ``calls`` row of an ended call's snapshot."""
    stats = call.stats
    ended = call.ended if call.ended is not None else (written_at or time.time())
    started = call.started if call.started is not None else ended
    return {
        "id": call.id,
        "direction": call.direction,
        "kind": call.kind,
        "from_number": call.from_,
        "to_number": call.to,
        "route": call.route,
        "profile": profile,
        "provider": call.provider,
        "worker": call.worker,
        "context": call.context.model_dump(mode="json") if call.context is not None else None,
        "started_at": started,
        "answered_at": call.answered,
        "ended_at": ended,
        "duration_s": call.duration_s,
        "end_reason": call.end_reason[:64],
        "codec": call.codec,
        "transport": call.transport,
        "srtp": call.srtp,
        "cost": call.cost,
        "mos": stats.mos,
        "jitter_ms": stats.jitter_ms,
        "loss_pct": stats.loss_pct,
        "concealed": stats.concealed,
        "provider_latency_p50_ms": stats.provider_latency_p50_ms,
        "provider_latency_last_ms": stats.provider_latency_last_ms,
        "barge_ins": stats.barge_ins,
        "resumes": stats.resumes,
        "tool_call_count": stats.tool_calls,
        # Every figure, for those without a column of their own; the level sparkline is for live calls only.
        "stats": stats.model_dump(mode="json", exclude={"level_history", "level_dbfs"}),
        "dtmf": call.dtmf,
        "recording_path": call.recording.path if call.recording is not None else None,
        "recording": call.recording.model_dump(mode="json") if call.recording is not None else None,
        "written_at": written_at if written_at is not None else time.time(),
        "trace_id": call.trace_id,
        "handoffs": stats.handoffs,
        "dtmf_events": [line.model_dump(mode="json") for line in call.dtmf_events],
        "handoff_log": [line.model_dump(mode="json") for line in call.handoffs] or None,
        "amd": call.amd.model_dump(mode="json") if call.amd is not None else None,
        "referrals": [line.model_dump(mode="json") for line in call.referrals] or None,
        "transfer": call.transfer.model_dump(mode="json") if call.transfer is not None else None,
        "trunk": call.trunk,
    }


def transcript_rows(call: CallSnapshot) -> list[dict[str, Any]]:
    return [
        {
            "call_id": call.id,
            "seq": seq,
            "role": line.role,
            "text": line.text,
            "start_s": line.start_s,
            "end_s": line.end_s,
            "truncated": line.truncated,
        }
        for seq, line in enumerate(call.transcript)
    ]


def tool_rows(call: CallSnapshot) -> list[dict[str, Any]]:
    return [
        {
            "call_id": call.id,
            "seq": seq,
            "name": tool.name,
            "arguments": tool.arguments,
            "result": tool.result,
            "start_s": tool.start_s,
            "duration_ms": tool.duration_ms,
        }
        for seq, tool in enumerate(call.tools)
    ]


def record_from_rows(
    row: Mapping[Any, Any],
    transcript: Sequence[Mapping[Any, Any]] = (),
    tools: Sequence[Mapping[Any, Any]] = (),
) -> CallRecord:
    """The record of a ``calls`` row (and, for the whole record, its transcript and tool rows in order)."""
    return CallRecord.model_validate(
        {
            "id": row["id"],
            "direction": row["direction"],
            "kind": row["kind"],
            "from": row["from_number"],
            "to": row["to_number"],
            "route": row["route"],
            "profile": row["profile"],
            "provider": row["provider"],
            "state": "ended",
            "worker": row["worker"],
            "codec": row["codec"],
            "srtp": row["srtp"],
            "transport": row["transport"],
            "cost": row["cost"],
            "started": row["started_at"],
            "answered": row["answered_at"],
            "ended": row["ended_at"],
            "duration_s": row["duration_s"],
            "end_reason": row["end_reason"],
            "stats": CallStats.model_validate(row["stats"]),
            "transcript": [
                TranscriptLine(
                    role=item["role"],
                    text=item["text"],
                    start_s=item["start_s"],
                    end_s=item["end_s"],
                    truncated=bool(item["truncated"]),
                )
                for item in transcript
            ],
            "tools": [
                ToolCallLine(
                    name=tool["name"],
                    arguments=tool["arguments"],
                    result=tool["result"],
                    start_s=tool["start_s"],
                    duration_ms=tool["duration_ms"],
                )
                for tool in tools
            ],
            "dtmf": row["dtmf"],
            "dtmf_events": row["dtmf_events"] or [],
            "trace_id": row["trace_id"],
            "context": row["context"],
            "handoffs": row.get("handoff_log") or [],
            "recording_path": row["recording_path"],
            "recording": row.get("recording"),
            "amd": row.get("amd"),
            "referrals": row.get("referrals") or [],
            "transfer": row.get("transfer"),
            "trunk": row.get("trunk"),
        }
    )
