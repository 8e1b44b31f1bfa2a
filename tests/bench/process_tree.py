"""What the bench process tests share: polling a check with a deadline, and whether a process still runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], T | None], within: float) -> T:
    """What ``check`` finds, polled until ``within`` seconds pass (AssertionError naming ``what`` then)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {within:.0f} s: {what}")


def alive(process: psutil.Process) -> bool:
    """Running, and not a zombie: a child that exited as its parent did may wait for this host's init to reap it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
