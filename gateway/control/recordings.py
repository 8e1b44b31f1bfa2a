"""``GET /v1/calls/{id}/recording``: a call's recording, served from the recordings directory with Range support.

The workers write recordings (gateway/worker/recorder.py) into the directory this control plane reads
(``GATEWAY_RECORDINGS_DIR``: the same directory on one host, or a volume they share); the call's record names the
file relative to it. Starlette's ``FileResponse`` answers ``Range`` requests (206, multipart for several ranges,
416 for ranges outside the file), so a player can seek in a long call. A record that names a path outside the
directory is refused rather than followed.
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import FileResponse

from gateway.control.api import errors
from gateway.control.auth import require_token_or_media_cookie
from gateway.control.history import CallHistory
from gateway.fleet.errors import CallNotFoundError
from gateway.fleet.json_errors import ApiError

MEDIA_TYPES = {"wav": "audio/wav", "ogg": "audio/ogg"}

# The bearer token, or the dashboard's gateway_media cookie: its <audio> element cannot send a header.
router = APIRouter(prefix="/v1", dependencies=[Depends(require_token_or_media_cookie)])


def recording_file(directory: FilePath, relative: str) -> FilePath | None:
    """The file a record's relative path names inside ``directory``; None when it points outside it."""
    root = directory.resolve()
    path = (root / relative).resolve()
    return path if path.is_relative_to(root) and path != root else None


@router.get(
    "/calls/{call_id}/recording",
    tags=["calls"],
    response_class=FileResponse,
    responses={
        **errors(404, 416),
        200: {"content": {"audio/wav": {}, "audio/ogg": {}}, "description": "The recording (206 for a Range)"},
        206: {"content": {"audio/wav": {}, "audio/ogg": {}}, "description": "The ranges asked for"},
    },
)
async def get_recording(
    request: Request, call_id: Annotated[str, Path(min_length=1, max_length=128, description="Call id")]
) -> FileResponse:
    """The call's recording (WAV or Ogg/Opus) as the worker wrote it; ``Range`` requests get 206."""
    history: CallHistory = request.app.state.history
    record = await history.get(call_id)
    if record is None:
        raise CallNotFoundError(call_id)
    recording = record.recording
    if recording is None:
        raise ApiError(404, "no_recording", f"call {call_id!r} was not recorded")
    path = recording_file(request.app.state.settings.recordings_path, recording.path)
    if path is None:
        raise ApiError(404, "no_recording", f"call {call_id!r}: its recording's path is outside the directory")
    if not path.is_file():
        raise ApiError(404, "no_recording", f"call {call_id!r}: its recording {recording.path} is not in the directory")
    filename = f"{call_id}.{recording.format}"
    return FileResponse(
        path, media_type=MEDIA_TYPES[recording.format], filename=filename, content_disposition_type="inline"
    )
