"""Call snapshots for the control plane: one shape for SIP and WebRTC legs.

A snapshot is what the ops API, the dashboard and the event stream show of a call. The media half comes
from whichever transport carried the call (the tick engine's RTP statistics or aiortc's), the agent half
from the call's session; both are merged here so the two kinds of call report identically.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gateway.fleet.models import (
    AmdLine,
    CallContextModel,
    CallSnapshot,
    CallStats,
    DtmfLine,
    GuardrailTripLine,
    HandoffLine,
    RecordingModel,
    ToolCallLine,
    TranscriptLine,
    TransferLine,
)
from gateway.fleet.mos import estimate_mos
from gateway.session.amd_gate import AmdReport
from gateway.session.session import CallSession
from gateway.sip.caller_context import CallContext
from gateway.sip.uri import parse_name_addr

TRANSCRIPT_TAIL = 50  # items in a live call's snapshot (the dashboard's view)
TRANSCRIPT_MAX = 2000  # items in an ended call's last snapshot: its record in the database of calls
TOOL_TEXT_MAX = 8192  # characters of a tool call's arguments or result kept in the record


def user_part(uri: str) -> str:
    """The user of a SIP URI (the dialled number), or the text itself when it is not a SIP URI."""
    try:
        user = getattr(parse_name_addr(uri).uri, "user", None)
    except Exception:
        return uri
    return str(user) if user else uri


def media_fields(
    *,
    packets_in: int,
    packets_out: int,
    lost: int,
    loss_pct: float,
    jitter_ms: float,
    delay_ms: float,
    codec: str,
    late: int = 0,
    rtt_ms: float | None = None,
    concealed: int = 0,
    underruns: int = 0,
    discarded: int = 0,
    inserted: int = 0,
) -> dict[str, Any]:
    """The media half of CallStats, with an E-model MOS estimate from loss and one-way delay."""
    loss_pct = min(100.0, max(0.0, loss_pct))
    fields: dict[str, Any] = {
        "rtp_packets_in": packets_in,
        "rtp_packets_out": packets_out,
        "rtp_lost": lost,
        "loss_pct": loss_pct,
        "jitter_ms": jitter_ms,
        "late": late,
        "rtt_ms": rtt_ms,
        "concealed": concealed,
        "underruns": underruns,
        "discarded": discarded,
        "inserted": inserted,
    }
    if packets_in:
        fields["mos"] = estimate_mos(loss_pct=loss_pct, delay_ms=delay_ms + (rtt_ms or 0.0) / 2, codec=codec)
    return fields


def session_fields(session: CallSession | None) -> dict[str, Any]:
    if session is None:
        return {}
    stats = session.stats()
    return {
        "provider_latency_last_ms": stats.round_trip_ms_last,
        "provider_latency_p50_ms": stats.round_trip_ms_mean,
        "barge_ins": stats.barge_ins,
        "resumes": stats.resumes,
        "tool_calls": stats.tool_calls,
        "agent_audio_gaps": stats.agent_audio_gaps,
        "handoffs": session.handoffs,
        "guardrail_trips": guardrail_lines(session),
    }


def guardrail_lines(session: CallSession) -> list[GuardrailTripLine]:
    began = session.started_at
    return [
        GuardrailTripLine(
            guardrail=event.guardrail,
            reason=event.reason[:200],
            response_id=event.response_id[:128],
            item_id=event.item_id[:128],
            at_s=max(0.0, at - began),
            heard_ms=sum(item.sent_ms for item in event.items),
            followed_up=event.followed_up,
        )
        for at, event in session.guardrail_trips
    ]


def level_fields(last_level: float | None, levels: Iterable[float]) -> dict[str, Any]:
    if last_level is None:
        return {}
    return {"level_dbfs": min(last_level, 0.0), "level_history": [min(v, 0.0) for v in levels]}


def transcript_of(session: CallSession | None, *, ended: bool = False) -> list[TranscriptLine]:
    """What was said, each item with when it began in the call; a live call's tail, an ended call's whole (bounded).

    Tool calls are not transcript lines: :func:`tools_of` reports them."""
    if session is None:
        return []
    said = [entry for entry in session.transcript if entry.kind == "message"]
    said = said[:TRANSCRIPT_MAX] if ended else said[-TRANSCRIPT_TAIL:]
    began = session.started_at
    return [
        TranscriptLine(
            role=entry.role,
            text=entry.text,
            start_s=max(0.0, entry.at - began) if entry.at else None,
            end_s=max(0.0, entry.ended_at - began) if entry.ended_at is not None else None,
            truncated=entry.truncated,
        )
        for entry in said
    ]


def handoffs_of(session: CallSession | None) -> list[HandoffLine]:
    """The call's handoffs between agent profiles (the last 256)."""
    if session is None:
        return []
    return [
        HandoffLine(
            at_s=max(0.0, line.at_s),
            from_profile=line.from_profile[:128],
            to_profile=line.to_profile[:128],
            reason=line.reason[:500],
            initiator=line.initiator,
            ok=line.ok,
            error=line.error[:1000],
        )
        for line in session.handoff_lines[-256:]
    ]


def dtmf_of(session: CallSession | None) -> tuple[str, list[DtmfLine]]:
    """The digits the caller sent (the record's ``dtmf``) and every digit received or sent, with its time."""
    if session is None:
        return "", []
    log = session.dtmf_log
    began = session.started_at
    received = "".join(entry.digit for entry in log if entry.direction == "received")
    lines = [DtmfLine(digit=e.digit, direction=e.direction, at_s=max(0.0, e.at - began), method=e.method) for e in log]
    return received[:256], lines


def tools_of(session: CallSession | None) -> list[ToolCallLine]:
    """The tools the agent called, with their arguments and results (paired by call id), in call order."""
    if session is None:
        return []
    began = session.started_at
    calls: dict[str, ToolCallLine] = {}
    done: dict[str, tuple[str, float]] = {}
    for entry in session.transcript:
        if entry.kind == "function_call" and entry.call_id not in calls:
            calls[entry.call_id] = ToolCallLine(
                name=entry.name[:64],
                arguments=entry.arguments[:TOOL_TEXT_MAX],
                start_s=max(0.0, entry.at - began) if entry.at else None,
            )
        elif entry.kind == "function_call_output":
            done[entry.call_id] = (entry.output[:TOOL_TEXT_MAX], entry.at)
    tools = []
    for call_id, call in calls.items():
        if call_id in done:
            result, at = done[call_id]
            # The output enters the transcript when it reached the provider: the duration is call to delivery.
            duration = (at - began - call.start_s) * 1000 if call.start_s is not None and at else None
            call = call.model_copy(
                update={"result": result, "duration_ms": max(0.0, duration) if duration is not None else None}
            )
        tools.append(call)
    return tools


def call_state(leg_state: str, session: CallSession | None) -> str:
    if session is not None and leg_state == "active" and session.state.value == "resuming":
        return "resuming"
    return leg_state


def build_snapshot(
    *,
    call_id: str,
    kind: str,
    direction: str,
    from_: str,
    to: str,
    route: str,
    provider: str,
    state: str,
    worker: str,
    codec: str,
    cost: float,
    started: float,
    answered: float | None,
    ended: float | None,
    end_reason: str,
    stats: dict[str, Any],
    session: CallSession | None,
    srtp: str = "",
    transport: str = "",
    context: CallContext | None = None,
    trace_id: str = "",
    recording: RecordingModel | None = None,
    amd: AmdReport | None = None,
    transfer: TransferLine | None = None,
    trunk: str | None = None,
) -> CallSnapshot:
    end = ended or time.time()
    dtmf, dtmf_events = dtmf_of(session) if state == "ended" else ("", [])
    return CallSnapshot.model_validate(
        {
            "id": call_id,
            "direction": direction,
            "kind": kind,
            "from": from_[:256],
            "to": to[:256],
            "route": route,
            "provider": provider,
            "state": call_state(state, session),
            "worker": worker,
            "codec": codec,
            "srtp": srtp,
            "transport": transport,
            "trunk": trunk,
            "cost": cost,
            "started": started,
            "answered": answered,
            "ended": ended,
            "duration_s": max(0.0, end - (answered or started)),
            "end_reason": end_reason if state == "ended" else "",
            "stats": CallStats(**{**stats, **session_fields(session)}),
            "transcript": transcript_of(session, ended=state == "ended"),
            "tools": tools_of(session) if state == "ended" else [],
            "handoffs": handoffs_of(session),
            "context": CallContextModel.of(context) if context is not None else None,
            "trace_id": trace_id,
            "dtmf": dtmf,
            "dtmf_events": dtmf_events,
            "recording": recording,
            "amd": AmdLine.model_validate(
                {"result": amd.result, "reason": amd.reason, "at_s": amd.at_s, "beep_at_s": amd.beep_at_s}
            )
            if amd is not None
            else None,
            "transfer": transfer,
        }
    )
