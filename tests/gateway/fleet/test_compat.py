"""Parsing messages from a newer fleet process: unknown fields ignored and named, known ones still checked."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from gateway.fleet.compat import describe, field_path, parse_answer, parse_message
from gateway.fleet.models import AdmissionDecision, HeartbeatRequest, WorkerInfo

NEWER = {
    "info": {
        "id": "w",
        "capacity": 4,
        "zone": "eu-1",
        "registration": {"state": "registered", "registrar": "sip:r", "aor": "sip:a@r", "path": "<sip:edge>"},
    },
    "calls": [
        {"id": "c1", "state": "active", "archive": True},
        {"id": "c2", "state": "ringing", "stats": {"mos": 4.0, "dtx_frames": 1}, "archive": False},
    ],
    "sent_at": 1.0,
}


def test_unknown_fields_are_ignored_and_named_once_each_without_list_positions() -> None:
    parsed, unknown = parse_message(HeartbeatRequest, orjson.dumps(NEWER))
    assert unknown == ["calls.archive", "calls.stats.dtx_frames", "info.registration.path", "info.zone", "sent_at"]
    assert [c.id for c in parsed.calls] == ["c1", "c2"] and parsed.calls[1].stats.mos == 4.0
    assert parsed.info.registration is not None and parsed.info.registration.aor == "sip:a@r"
    assert parsed.model_extra is None and parsed.calls[0].model_extra is None  # nothing unknown is kept
    assert parse_message(WorkerInfo, b'{"id": "w"}') == (WorkerInfo(id="w"), [])


def test_wrong_and_missing_known_fields_are_refused_whatever_else_is_unknown() -> None:
    body = orjson.dumps({**NEWER, "info": {"capacity": "many", "zone": "eu-1"}})
    with pytest.raises(ValidationError) as caught:
        parse_message(HeartbeatRequest, body)
    assert [(field_path(e["loc"]), e["type"]) for e in caught.value.errors()] == [
        ("info.id", "missing"),
        ("info.capacity", "int_parsing"),
    ]
    assert describe(caught.value) == (
        "info.id: Field required; info.capacity: Input should be a valid integer, unable to parse string as an integer"
    )


def test_an_answer_already_decoded_is_parsed_the_same_way() -> None:
    answer = {
        "accepted": True,
        "call_id": "c1",
        "worker": "w",
        "route": "r",
        "queue_position": 0,
        "profile": {"name": "p", "provider": "echo", "language": "de"},
    }
    decision, unknown = parse_answer(AdmissionDecision, answer)
    assert decision.accepted and decision.profile is not None and decision.profile.provider == "echo"
    assert unknown == ["profile.language", "queue_position"]
    with pytest.raises(ValidationError):
        parse_answer(AdmissionDecision, {**answer, "accepted": "perhaps"})


def test_a_long_list_of_problems_is_cut_and_says_how_many_more() -> None:
    body = orjson.dumps({"info": {"id": "w"}, "calls": [{"id": "c", "state": "x"} for _ in range(12)]})
    with pytest.raises(ValidationError) as caught:
        parse_message(HeartbeatRequest, body)
    text = describe(caught.value)
    assert text.count("calls.") == 10 and text.endswith("; and 2 more")
