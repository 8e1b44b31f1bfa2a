"""Which libopus is loaded: the system's, else PyAV's copy, else an error that names what was tried."""

from __future__ import annotations

import ctypes.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from telcodecs import _libopus
from telcodecs.opus import OpusDecoder, OpusEncoder, OpusError, libopus_version


@pytest.fixture(autouse=True)
def fresh_load() -> Iterator[None]:
    _libopus.load.cache_clear()
    yield
    _libopus.load.cache_clear()  # the next test module gets the library the process would load


def test_the_loaded_library_is_libopus_and_says_which() -> None:
    opus = _libopus.load()
    assert opus.version.startswith("libopus ")
    assert opus.strerror(-4) == "corrupted stream"  # OPUS_INVALID_PACKET, in libopus's own words
    assert libopus_version() == f"{opus.version} ({opus.path})"


def test_without_a_system_library_the_copy_pyav_ships_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    opus = _libopus.load()
    assert Path(opus.path).parent.name == "av.libs" and Path(opus.path).name.startswith("libopus")
    assert opus.version.startswith("libopus ")
    encoder, decoder = OpusEncoder(), OpusDecoder()  # and it works
    assert decoder.decode(encoder.encode(np.zeros(960, np.int16))).shape == (960,)


def test_with_no_library_at_all_the_error_names_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "/nonexistent/libopus.so.0")
    monkeypatch.setattr(_libopus, "_pyav_copies", list)
    with pytest.raises(OpusError) as caught:
        OpusDecoder()
    message = str(caught.value)
    assert "libopus not found" in message and "libopus0" in message
    assert "/nonexistent/libopus.so.0" in message
