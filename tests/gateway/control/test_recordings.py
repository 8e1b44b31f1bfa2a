"""``GET /v1/calls/{id}/recording`` over a real database of calls (SQLite): the file with its content type and Range
answers, 404s with their codes, a path outside the directory refused; retention deletes the files with their
records; the plane publishes ``call.recording_ready`` once for a finished recording."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gateway.control.app import create_app
from gateway.control.recordings import recording_file
from gateway.control.settings import ControlSettings
from gateway.fleet.models import RecordingModel, WorkerEvent
from gateway.media.recording import wav_header
from gateway.records import RetentionJob
from gateway.records.history import get_record, write_records
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.records.conftest import ended_call

T0 = 1_767_225_600.0
AUDIO = wav_header(sample_rate=16_000, channels=2, data_bytes=6400) + bytes(range(256)) * 25


@dataclass
class Served:
    app: FastAPI
    client: httpx.AsyncClient
    directory: Path


def _recording(path: str, fmt: str = "wav", size: int = len(AUDIO)) -> RecordingModel:
    return RecordingModel(path=path, format=fmt, channels=2, sample_rate=16_000, bytes=size, duration_s=0.1)  # type: ignore[arg-type]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    directory = tmp_path / "recordings"
    (directory / "2026-01-01").mkdir(parents=True)
    (directory / "2026-01-01" / "c-wav.wav").write_bytes(AUDIO)
    (directory / "2026-01-01" / "c-ogg.ogg").write_bytes(b"OggS" + bytes(60))
    (tmp_path / "secret.wav").write_bytes(b"not yours")
    settings = ControlSettings(
        api_token=TOKEN, database_url=f"sqlite:///{tmp_path / 'calls.db'}", retention_days=0, recordings_dir=directory
    )
    app = create_app(settings, config=make_config(), sweeper=False)
    calls = [
        ended_call("c-wav", started=T0).model_copy(update={"recording": _recording("2026-01-01/c-wav.wav")}),
        ended_call("c-ogg", started=T0).model_copy(update={"recording": _recording("2026-01-01/c-ogg.ogg", "ogg")}),
        ended_call("c-none", started=T0),
        ended_call("c-gone", started=T0).model_copy(update={"recording": _recording("2026-01-01/c-gone.wav")}),
        ended_call("c-out", started=T0).model_copy(update={"recording": _recording("../secret.wav")}),
    ]
    async with app.router.lifespan_context(app):
        await write_records(app.state.history.database, [(call, "support") for call in calls], now=T0 + 60)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://control.test", headers=AUTH) as client:
            yield Served(app=app, client=client, directory=directory)


async def test_the_recording_is_served_whole_and_by_range(served: Served) -> None:
    whole = await served.client.get("/v1/calls/c-wav/recording")
    assert whole.status_code == 200 and whole.content == AUDIO
    assert whole.headers["content-type"] == "audio/wav" and whole.headers["accept-ranges"] == "bytes"
    part = await served.client.get("/v1/calls/c-wav/recording", headers={"Range": "bytes=44-143"})
    assert part.status_code == 206 and part.content == AUDIO[44:144]
    assert part.headers["content-range"] == f"bytes 44-143/{len(AUDIO)}"
    tail = await served.client.get("/v1/calls/c-wav/recording", headers={"Range": "bytes=-10"})
    assert tail.status_code == 206 and tail.content == AUDIO[-10:]
    beyond = await served.client.get("/v1/calls/c-wav/recording", headers={"Range": f"bytes={len(AUDIO) + 5}-"})
    assert beyond.status_code == 416
    ogg = await served.client.get("/v1/calls/c-ogg/recording")
    assert ogg.status_code == 200 and ogg.headers["content-type"] == "audio/ogg" and ogg.content.startswith(b"OggS")
    record = (await served.client.get("/v1/calls/c-wav")).json()
    assert (
        record["recording"]["path"] == "2026-01-01/c-wav.wav"
        and record["recording_path"] == record["recording"]["path"]
    )


async def test_no_recording_answers_404_with_a_reason_and_the_token_is_required(served: Served) -> None:
    for call_id, code in (("c-nope", "call_not_found"), ("c-none", "no_recording"), ("c-gone", "no_recording")):
        answer = await served.client.get(f"/v1/calls/{call_id}/recording")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == code, (call_id, answer.text)
    outside = await served.client.get("/v1/calls/c-out/recording")
    assert outside.status_code == 404 and "outside" in outside.json()["error"]["message"]
    anonymous = await served.client.get("/v1/calls/c-wav/recording", headers={"Authorization": ""})
    assert anonymous.status_code == 401


def test_a_path_that_leaves_the_directory_is_refused(tmp_path: Path) -> None:
    assert recording_file(tmp_path, "2026-01-01/c.wav") == (tmp_path / "2026-01-01" / "c.wav").resolve()
    assert recording_file(tmp_path, "../c.wav") is None
    assert recording_file(tmp_path, "/etc/passwd") is None
    assert recording_file(tmp_path, ".") is None


async def test_retention_deletes_the_files_with_their_records(served: Served) -> None:
    database = served.app.state.history.database
    job = RetentionJob(database, retention_days=1, clock=lambda: T0 + 2 * 86_400, recordings_dir=served.directory)
    assert await job.sweep() == 5
    assert await get_record(database, "c-wav") is None
    assert not (served.directory / "2026-01-01" / "c-wav.wav").exists()
    assert not (served.directory / "2026-01-01" / "c-ogg.ogg").exists()
    assert (served.directory.parent / "secret.wav").exists()  # named outside the directory: left alone


async def test_the_plane_publishes_recording_ready_once_for_a_finished_recording(served: Served) -> None:
    plane = served.app.state.plane
    live = ended_call("c-live", started=T0).model_copy(
        update={"state": "active", "ended": None, "end_reason": "", "recording": _recording("d/c-live.wav", size=0)}
    )
    await plane.report([WorkerEvent(type="call.started", worker="worker-a", time=T0, call=live)])
    done = ended_call("c-live", started=T0).model_copy(update={"recording": _recording("d/c-live.wav")})
    await plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=T0 + 30, call=done)])
    await plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=T0 + 31, call=done)])
    events, _, _ = await plane.events_since(0)
    ready = [event for event in events if event.type == "call.recording_ready"]
    assert [event.data["call_id"] for event in ready] == ["c-live"]
    assert ready[0].data["recording"]["path"] == "d/c-live.wav" and ready[0].data["recording"]["bytes"] == len(AUDIO)
    lost = ended_call("c-lost", started=T0).model_copy(update={"recording": _recording("d/c-lost.wav", size=0)})
    await plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=T0 + 40, call=lost)])
    events, _, _ = await plane.events_since(0)
    assert [event.data["call_id"] for event in events if event.type == "call.recording_ready"] == ["c-live"]
