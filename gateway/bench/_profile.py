"""Where the worker's time goes: py-spy's collapsed stacks grouped into the categories docs/performance.md uses.

``py-spy record --format raw`` writes one line per distinct stack: ``frame;frame;...;leaf COUNT`` with
frames like ``function (path/file.py:line)``. Each sample is charged to the first category that matches,
walking from the leaf towards the root, so time inside ``base64`` called from the OpenAI adapter counts as
JSON/base64 and not as the adapter's bookkeeping. Idle samples (the loop waiting in ``epoll``) are counted
apart when py-spy was run with ``--idle``.
"""

from __future__ import annotations

import sys
from collections import Counter
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


def report(path: str | Path) -> str:
    totals = categorize(Path(path).read_text().splitlines())
    all_samples = sum(totals.values()) or 1
    width = max(len(k) for k in totals) if totals else 10
    return "\n".join(
        f"{name.ljust(width)}  {100 * count / all_samples:5.1f} %  ({count} samples)"
        for name, count in totals.most_common()
    )


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(f"{argument}:\n{report(argument)}")
