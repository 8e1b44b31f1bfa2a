"""The census of what the collector's middle passes walk (``gateway bench calls --gc-census``)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.census import YoungCensus, count, kind, read, summary


class Frame:
    pass


def test_a_tuple_is_named_by_the_kinds_of_its_first_items() -> None:
    assert kind((Frame(), 3, "x")) == "tuple(Frame,int,str)"
    assert kind((1, 2, 3, 4, 5, 6)) == "tuple(int,int,int,int,+2)"
    assert kind(Frame()) == "Frame"
    walked, kinds = count([(Frame(), 1)] * 3 + [Frame(), {}], top=2)
    assert walked == 5 and kinds == [("tuple(Frame,int)", 3), ("Frame", 1)]


def test_a_tuple_still_being_built_is_named_without_touching_its_empty_slots() -> None:
    """The young generations can hold a tuple whose slots are not filled yet (NULL): a census that indexed it
    crashed a benchmark's worker. In a child process, so that a regression fails this test, not the run."""
    code = (
        "import ctypes\n"
        "from bench.census import kind\n"
        "new = ctypes.pythonapi.PyTuple_New\n"
        "new.restype, new.argtypes = ctypes.py_object, [ctypes.c_ssize_t]\n"
        "half = new(6)  # tracked by the collector, every slot NULL\n"
        "item = 7\n"
        "ctypes.pythonapi.Py_IncRef(ctypes.py_object(item))  # the slot's own reference\n"
        "slots = id(half) + tuple.__basicsize__  # ob_item[0], just past the header\n"
        "ctypes.c_void_p.from_address(slots).value = id(item)  # the first slot filled, five still NULL\n"
        "print(kind(half))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "tuple(int)"


def test_a_middle_pass_is_counted_once_per_interval_and_the_hook_comes_out(tmp_path: Path) -> None:
    path = tmp_path / "census.jsonl"
    census = YoungCensus(path, every_s=3600.0)
    gc.collect()
    gc.disable()
    try:
        queued = [(Frame(), n) for n in range(3000)]  # young: made since the last pass
        census.install()
        gc.collect(1)
        gc.collect(1)  # within the interval: not counted again
        gc.collect(0)  # a young pass: never counted
    finally:
        census.close()
        gc.enable()
    assert census._on_gc not in gc.callbacks
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    kinds = dict(record["kinds"])
    assert kinds["tuple(Frame,int)"] == len(queued)
    assert kinds["Frame"] == len(queued)
    assert record["walked"] >= 2 * len(queued)
    assert abs(record["at"] - time.time()) < 60


def test_the_window_picks_its_censuses_and_the_summary_takes_medians(tmp_path: Path) -> None:
    path = tmp_path / "census.jsonl"
    lines = [
        {"at": 100.0, "walked": 50_000, "kinds": [["early", 40_000]]},
        {"at": 201.0, "walked": 18_000, "kinds": [["tuple(ndarray,ItemAudio,int)", 10_000], ["coroutine", 1_500]]},
        {"at": 202.0, "walked": 16_000, "kinds": [["tuple(ndarray,ItemAudio,int)", 9_000], ["Frame", 1_200]]},
        {"at": 203.0, "walked": 20_000, "kinds": [["tuple(ndarray,ItemAudio,int)", 11_000], ["coroutine", 1_700]]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    window = read(path, since=200.0, until=300.0)
    assert [r["walked"] for r in window] == [18_000, 16_000, 20_000]
    assert summary(window, top=3) == (
        "a middle pass walked 18000 objects (median of 3 censuses); "
        "most: tuple(ndarray,ItemAudio,int) 10000, coroutine 1500"  # Frame: in one census of three
    )
    assert read(tmp_path / "none.jsonl", since=0.0, until=1.0) == []
    assert summary([]) == "no middle pass started a census"
