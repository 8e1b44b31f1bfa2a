"""`gateway bench codecs --quick --json` runs and prints one JSON object of the documented shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_json_shape() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "codecs", "--quick", "--json", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) >= {"results", "env"}
    results = report["results"]
    assert all({"name", "calls", "us_per_call_frame"} <= set(r) for r in results)
    assert all(isinstance(r["calls"], int) and r["us_per_call_frame"] > 0 for r in results)
    batched = {r["calls"] for r in results if r["path"] == "batched" and r["name"].startswith("g711")}
    assert batched == {1, 10, 100, 1000}
    paths = {(r["name"].split()[0], r["path"]) for r in results}
    for path in ("per-call", "aiortc", "av", "soxr"):
        assert ("g711<->24k", path) in paths
    for path in ("batched", "libopus-24k", "aiortc", "pyav-codec"):
        assert ("opus<->24k", path) in paths
    encode = {r["name"]: r["us_per_call_frame"] for r in results if r["family"] == "opus-encode"}
    assert len(encode) == 3
    # Reusing the settled silence packet skips libopus: far cheaper than encoding the same silence.
    assert (
        encode["opus encode, silence, settled packet reused"] * 5
        < encode["opus encode, silence, every frame through libopus"]
    )
    loss = {r["path"]: r["us_per_call_frame"] for r in results if r["family"] == "opus-loss"}
    assert set(loss) == {"received", "conceal", "bridge"}
    # A lost frame costs about a decode: libopus conceals it, or rebuilds it from the next packet's FEC copy.
    assert loss["conceal"] < 8 * loss["received"] and loss["bridge"] < 8 * loss["received"]
    assert {"python", "cpu", "cpu_count", "versions"} <= set(report["env"])
    assert report["env"]["versions"]["libopus"].startswith("libopus ")
    assert report["env"]["versions"]["libg722"].startswith("libg722 ")
    assert {"batched", "per-call"} <= {r["path"] for r in results if r["family"] == "g722"}
    g722 = {(r["path"], r["name"].split()[1].rstrip(",")) for r in results if r["family"] == "g722-codec"}
    # FFmpeg's always (PyAV is a dependency), spandsp's where it is installed.
    assert {("libg722", "encode"), ("libg722", "decode"), ("ffmpeg", "encode"), ("ffmpeg", "decode")} <= g722
