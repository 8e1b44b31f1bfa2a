"""`gateway bench frames`: both ways of each case do the same work, and the command refuses nonsense counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.frames import MESSAGES, append_message, cases, library_framer, link_framer
from tests.gateway.providers.helpers import open_server_protocol

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "frames", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_json_has_both_framers_for_every_message() -> None:
    done = bench("--json", "--repeats", "2", "--count", "50")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ways = [(row["what"], row["baseline"], row["ours"]) for row in report["results"]]
    assert ways == [
        *((f"frame append, {label}", "websockets", "TextFrames") for label in MESSAGES),
        ("base64 encode, 20 ms pcm", "base64", "pybase64"),
        ("base64 decode, 100 ms delta", "base64", "pybase64"),
        ("frame of a tick row", "Frame()", "unchecked_frame"),
    ]
    for row in report["results"]:
        assert set(row["median_us"]) == {"baseline", "ours"}
        assert all(len(runs) == 2 and min(runs) > 0 for runs in row["runs_us"].values())
        assert row["ratio"] == row["median_us"]["ours"] / row["median_us"]["baseline"]


def test_both_framers_frame_the_same_text() -> None:
    """What is timed is equivalent work: each side's bytes hold the same message (the masks differ)."""
    server = open_server_protocol()
    message = append_message(MESSAGES["pcm 24 kHz, 20 ms"])
    library_bytes = b"".join(library_framer()(message))  # type: ignore[arg-type]
    link_bytes = link_framer()(message)
    assert isinstance(link_bytes, bytes) and len(link_bytes) == len(library_bytes)
    server.receive_data(library_bytes + link_bytes)
    assert [bytes(frame.data) for frame in server.events_received()] == [message, message]


def test_both_base64_ways_give_the_same_bytes() -> None:
    """The cases time equal work: each one's two ways agree on its payload."""
    for case in cases():
        if case.what.startswith("base64"):
            assert case.build(True)(case.payload) == case.build(False)(case.payload)


def test_zero_repeats_is_refused_with_a_reason() -> None:
    done = bench("--repeats", "0")
    assert done.returncode != 0
    assert "--repeats and --count must be at least 1" in done.stderr


def test_both_ways_of_building_a_frame_give_the_same_frame() -> None:
    case = next(c for c in cases() if c.what == "frame of a tick row")
    checked, unchecked = case.build(True)(case.payload), case.build(False)(case.payload)
    assert repr(checked) == repr(unchecked)
    assert checked.pcm.base is unchecked.pcm.base  # type: ignore[attr-defined]  # the same batch, no copy
