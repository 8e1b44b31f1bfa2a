"""Argument types the benchmarks' command lines share: CPU lists and lists of call counts."""

from __future__ import annotations

import argparse

from bench.processes import cpu_list


def cpus(text: str) -> tuple[int, ...]:
    """``1``, ``1,2,3``, ``2-5`` or ``-1`` (not pinned: the empty tuple)."""
    try:
        return cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sizes(text: str) -> tuple[int, ...]:
    """Comma-separated call counts: ``50,100,200``."""
    try:
        found = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of call counts: {text!r} (say 50,100,200)") from None
    if not found:
        raise argparse.ArgumentTypeError("no size given")
    return found
