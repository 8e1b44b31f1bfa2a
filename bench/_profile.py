"""Where the worker's time goes: sampled stacks grouped into the categories docs/performance.md uses.

Two samplers, one per kind of worker:

* **py-spy** for the worker run from source. ``py-spy record --format raw`` writes one line per distinct stack:
  ``frame;frame;...;leaf COUNT`` with frames like ``function (path/file.py:line)``. Each sample is charged to
  the first category that matches, walking from the leaf towards the root, so time inside ``base64`` called
  from the OpenAI adapter counts as JSON/base64 and not as the adapter's bookkeeping. Idle samples (the loop
  waiting in ``epoll``) are counted apart when py-spy was run with ``--idle``.
* **perf** for the compiled worker (``gateway compile``), whose hot functions are C that py-spy cannot see.
  ``perf record --call-graph dwarf`` unwinds through mypyc's functions (``CPyDef_<module>___<name>``), the
  interpreter, numpy and the kernel. A sample whose stack holds a system call is charged to that system call
  (the loopback peer's receive path runs inside the sender's ``sendto`` and ``write``); any other sample to
  the first of: a library that does the work itself (numpy/BLAS, orjson/pybase64), else the innermost
  compiled function's module. The interpreter's own frames (dict lookups, allocation, attribute access) are
  charged to the compiled function or library that called into it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

# (category, substrings of a frame) in the order they are tried for each frame.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JSON/base64", ("base64", "orjson", "json/", "b64encode", "b64decode", "dumps", "loads")),
    ("websocket send/recv", ("websockets/", "providers/_link.py", "protocol.py")),
    ("RTP I/O", ("rtp_socket.py", "sendto", "recvfrom")),
    ("tick DSP", ("telcodecs", "codecs/", "media/tick.py", "media/jitter.py", "bench/_percall.py", "av/")),
    ("RTP parse/media state", ("media/rtp.py", "media/call.py", "media/reception.py", "media/rtcp.py")),
    ("session bookkeeping", ("gateway/session/", "worker/worker.py", "worker/legs.py")),
    ("SIP", ("gateway/sip/", "sip_transport.py")),
    ("metrics", ("prometheus_client",)),
    ("event loop", ("asyncio/", "uvloop", "clock.py")),
)


def categorize(lines: list[str]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        category = "other"
        for frame in reversed(frames):
            hit = next((name for name, keys in CATEGORIES if any(k in frame for k in keys)), None)
            if hit is not None:
                category = hit
                break
        totals[category] += int(count)
    return totals


# perf: system calls, by a kernel function anywhere in the sample's stack.
PERF_SYSCALLS: tuple[tuple[str, frozenset[str]], ...] = (
    ("RTP I/O: UDP system calls", frozenset({"__sys_sendto", "__sys_recvfrom", "__sys_sendmsg", "__sys_recvmsg"})),
    ("provider socket: TCP system calls", frozenset({"ksys_write", "ksys_read"})),
    ("event loop: epoll", frozenset({"do_epoll_wait"})),
)
# perf: user-space frames, walked from the leaf; (category, shared-object substrings, symbol prefixes).
PERF_FRAMES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("JSON/base64", ("orjson", "pybase64"), ()),
    ("DSP and arrays (numpy/BLAS)", ("_multiarray_umath", "openblas", "_umath"), ()),
    ("websocket framing and write", ("speedups",), ("CPyDef__frames___", "CPyDef__link___")),
    (
        "RTP receive, parse and per-packet state",
        (),
        ("CPyDef_rtp___", "CPyDef_rtp_socket___", "CPyDef_call___", "CPyDef_reception___", "CPyDef_rtcp___"),
    ),
    ("tick: per-call media state (jitter buffer, batching)", (), ("CPyDef_tick___", "CPyDef_jitter___")),
    (
        "session and provider adapter",
        (),
        (
            "CPyDef_session",
            "CPyDef_pipe___",
            "CPyDef_playout___",
            "CPyDef_turns___",
            "CPyDef_g711___",
            "CPyDef_stats___",
            "CPyDef_tasks___",
            "CPyDef_openai___",
        ),
    ),
    ("worker: per-call loop of the tick", (), ("CPyDef_worker___", "CPyDef_sip_calls___", "CPyDef_rfc4733___")),
    ("event loop", ("uvloop", "loop.cpython"), ("CPyDef_clock___",)),
)
INTERPRETED = "interpreted Python outside the compiled modules (websockets receive, asyncio, metrics)"

Frame = tuple[str, str]  # (symbol, shared object)


def perf_samples(text: str) -> list[list[Frame]]:
    """Parse ``perf script -F ip,sym,dso``: one block per sample, leaf first, lines ``ADDR SYMBOL (DSO)``."""
    samples: list[list[Frame]] = []
    current: list[Frame] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if current:
                samples.append(current)
                current = []
            continue
        _, _, rest = line.partition(" ")
        symbol, _, dso = rest.rpartition(" (")
        current.append((symbol.removesuffix(" (inlined)"), dso.rstrip(")")))
    if current:
        samples.append(current)
    return samples


def categorize_perf(samples: Iterable[Sequence[Frame]]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for frames in samples:
        totals[_perf_category(frames)] += 1
    return totals


def _perf_category(frames: Sequence[Frame]) -> str:
    symbols = {symbol for symbol, _ in frames}
    for name, calls in PERF_SYSCALLS:
        if symbols & calls:
            return name
    if any(dso.endswith("kallsyms]") for _, dso in frames[:1]):
        return "kernel, other (interrupts, scheduler, page faults)"
    interpreted = False
    for symbol, dso in frames:
        if symbol.startswith("_PyEval_EvalFrame"):
            interpreted = True  # Python code runs here; the frames further out called it
            continue
        for name, objects, prefixes in PERF_FRAMES:
            if any(o in dso for o in objects) or (prefixes and symbol.startswith(prefixes)):
                # Python code the loop called (a websocket's data_received, a task) is not the loop's own time.
                return INTERPRETED if interpreted and name == "event loop" else name
    return INTERPRETED


def perf_script(data: str | Path) -> str:
    """``perf script`` of a ``perf record`` file, the fields :func:`perf_samples` reads."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf is not installed (Debian: linux-perf)")
    argv = [perf, "script", "-i", str(data), "-F", "ip,sym,dso"]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def report(path: str | Path) -> str:
    if str(path).endswith(".data"):  # perf record
        totals = categorize_perf(perf_samples(perf_script(path)))
    else:
        totals = categorize(Path(path).read_text().splitlines())
    all_samples = sum(totals.values()) or 1
    width = max(len(k) for k in totals) if totals else 10
    return "\n".join(
        f"{name.ljust(width)}  {100 * count / all_samples:5.1f} %  ({count} samples)"
        for name, count in totals.most_common()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench._profile",
        description="The worker's sampled time by category: perf record files (*.data) or py-spy raw files.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="gateway bench calls --profile's output")
    args = parser.parse_args(argv)
    for path in args.files:
        if not Path(path).is_file():
            parser.error(f"no such file: {path}")
        try:
            print(f"{path}:\n{report(path)}")
        except subprocess.CalledProcessError as exc:
            parser.error(f"perf could not read {path}: {(exc.stderr or '').strip()[-300:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
