"""Fleet wire models: aliases, validation, the AgentProfile conversion."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.fleet import CallSnapshot, DtmfRequest, ProfileModel, TrunkRegistration, WorkerInfo
from gateway.fleet.models import HeartbeatRequest
from gateway.providers.base import AgentProfile


def test_call_snapshot_uses_from_on_the_wire() -> None:
    call = CallSnapshot.model_validate({"id": "c1", "from": "+1555", "to": "+1666"})
    assert call.from_ == "+1555"
    wire = call.wire()
    assert wire["from"] == "+1555" and "from_" not in wire
    assert CallSnapshot.model_validate_json(call.model_dump_json(by_alias=True)) == call


def test_models_reject_unknown_fields_and_bad_values() -> None:
    with pytest.raises(ValidationError):
        CallSnapshot.model_validate({"id": "c1", "sate": "active"})
    with pytest.raises(ValidationError):
        CallSnapshot.model_validate({"id": "c1", "state": "dancing"})
    with pytest.raises(ValidationError):
        WorkerInfo(id="bad id with spaces")
    with pytest.raises(ValidationError):
        CallSnapshot.model_validate({"id": "c1", "stats": {"mos": 7}})


@pytest.mark.parametrize("digits", ["0123456789", "*#", "ABCD", "abcd"])
def test_dtmf_accepts_rfc4733_events(digits: str) -> None:
    assert DtmfRequest(digits=digits).digits == digits.upper()


@pytest.mark.parametrize("digits", ["", "E", "1-2", " 1", "٣"])
def test_dtmf_rejects_anything_else(digits: str) -> None:
    with pytest.raises(ValidationError):
        DtmfRequest(digits=digits)


def test_default_profile_model_matches_the_default_agent_profile() -> None:
    default = AgentProfile()
    converted = ProfileModel().to_agent_profile()
    for name in ("name", "provider", "instructions", "max_duration_s", "audio_format", "turn_detection", "tools"):
        assert getattr(converted, name) == getattr(default, name), name


def test_a_workers_trunk_registration_crosses_the_wire_and_is_checked() -> None:
    example = WorkerInfo.model_json_schema()["examples"][0]
    info = WorkerInfo.model_validate(example)
    assert info.registration is not None and info.registration.state == "registered"
    body = HeartbeatRequest(info=info).model_dump_json()
    assert HeartbeatRequest.model_validate_json(body).info == info
    with pytest.raises(ValidationError):
        TrunkRegistration(state="confused", registrar="sip:r", aor="sip:a@r")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        TrunkRegistration(state="failed", registrar="sip:r", aor="sip:a@r", last_status=42)
    with pytest.raises(ValidationError):
        WorkerInfo.model_validate({**example, "registration": {**example["registration"], "secret": "x"}})
