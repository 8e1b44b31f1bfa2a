"""pytest fixtures for real-peer tests; import them into a conftest with
`from tests.support.fixtures import peer_procs, speech_8k, speech_48k_stereo  # noqa: F401`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.audio import speech_wav
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

__all__ = ["SPEECH", "peer_procs", "speech_8k", "speech_48k_stereo"]

SPEECH = "Hello, I would like to check my order status, please."


def require_speech_tools() -> None:
    require_binary("espeak-ng")
    require_binary("sox", package="sox libsox-fmt-all")


@pytest.fixture
async def peer_procs(tmp_path: Path) -> AsyncIterator[ProcessGroup]:
    """A ProcessGroup for this test; every process is stopped by PID at teardown and its log listed
    (pytest shows the listing when the test fails)."""
    group = ProcessGroup(tmp_path / "logs")
    try:
        yield group
    finally:
        await group.aclose()
        print(f"peer logs:\n{group.describe_logs()}")


@pytest.fixture
def speech_8k(tmp_path: Path) -> Path:
    """Spoken English, 8 kHz mono PCM16 (for G.711 phones)."""
    require_speech_tools()
    return speech_wav(SPEECH, tmp_path / "speech_8k.wav", rate=8000, channels=1)


@pytest.fixture
def speech_48k_stereo(tmp_path: Path) -> Path:
    """Spoken English, 48 kHz stereo PCM16 (for Opus phones: baresip's aufile does not resample)."""
    require_speech_tools()
    return speech_wav(SPEECH, tmp_path / "speech_48k.wav", rate=48000, channels=2)
