"""The bridge of a warm transfer: each leg's frame to the other, once, only once joined."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.worker.bridge import Bridge
from telcodecs.frames import FRAME_SAMPLES, Frame, unchecked_frame


def _frame(value: int, index: int = 0) -> Frame:
    return unchecked_frame(index, np.full(FRAME_SAMPLES, value, dtype=np.int16))


def test_each_legs_frame_goes_to_the_other_leg_once() -> None:
    bridge = Bridge("caller", "human")
    bridge.joined = True
    caller, human = _frame(1), _frame(2)
    bridge.heard("caller", caller)
    bridge.heard("human", human)
    assert bridge.frame_for("human") is caller
    assert bridge.frame_for("caller") is human
    # Nothing new heard: silence, not the last frame again.
    assert bridge.frame_for("human") is None and bridge.frame_for("caller") is None
    assert bridge.frames == 2


def test_a_later_frame_replaces_one_not_yet_sent() -> None:
    bridge = Bridge("a", "b")
    bridge.joined = True
    bridge.heard("a", _frame(1, 0))
    latest = _frame(2, 1)
    bridge.heard("a", latest)
    assert bridge.frame_for("b") is latest


def test_nothing_crosses_before_the_bridge_is_joined() -> None:
    bridge = Bridge("caller", "human")
    bridge.heard("human", _frame(5))  # the human speaks during their briefing: nobody hears it
    bridge.joined = True
    assert bridge.frame_for("caller") is None
    assert bridge.frames == 0


def test_g711_codes_travel_with_the_frame() -> None:
    bridge = Bridge("a", "b")
    bridge.joined = True
    codes = bytes(range(160))
    frame = unchecked_frame(0, np.zeros(FRAME_SAMPLES, dtype=np.int16), codes, "pcmu")
    bridge.heard("b", frame)
    sent = bridge.frame_for("a")
    assert sent is not None and sent.g711 == codes and sent.g711_law == "pcmu"


def test_unknown_legs_and_one_leg_twice() -> None:
    bridge = Bridge("a", "b")
    bridge.joined = True
    bridge.heard("c", _frame(1))
    assert bridge.frame_for("c") is None
    assert bridge.other("a") == "b" and bridge.other("b") == "a"
    with pytest.raises(ValueError):
        Bridge("a", "a")
