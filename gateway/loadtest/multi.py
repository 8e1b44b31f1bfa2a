"""Spreading one load test over worker processes, each with its own event loop and RTP port range.

``run(config, workers=N)`` gives worker *i* ``config.share(i, N)`` (its share of cps, concurrency and total,
a disjoint RTP port block, its own seed), starts N ``spawn`` processes, relays their progress snapshots,
collects their :class:`~gateway.loadtest.results.RunResult` and merges them. With one worker it runs in
this process. Either way the run is bounded: each worker stops at its hard deadline, and the parent stops
any worker still alive one minute after that (by its PID).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.loadtest.config import LoadConfig, LoadConfigError
from gateway.loadtest.results import Progress, RunResult, merge
from gateway.loadtest.runner import run_load

log = logging.getLogger(__name__)

_PARENT_GRACE_S = 60.0


class LoadWorkerError(RuntimeError):
    """A load-generator worker process failed; the message carries its traceback."""


def run_coroutine(coro: Coroutine[Any, Any, RunResult], *, use_uvloop: bool = True) -> RunResult:
    """Run on a fresh loop: uvloop when available (the load generator should be cheaper than what it loads)."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
    return asyncio.run(coro)


def _worker_main(config: LoadConfig, index: int, channel: Any, use_uvloop: bool, stop_on_signals: bool) -> None:
    try:
        result = run_coroutine(
            run_load(
                config,
                worker=index,
                progress=lambda p: channel.put(("progress", index, p)),
                stop_on_signals=stop_on_signals,
            ),
            use_uvloop=use_uvloop,
        )
        channel.put(("result", index, result))
    except BaseException:
        channel.put(("error", index, traceback.format_exc()))


def _forward_signals(processes: list[Any]) -> dict[int, Any]:
    """SIGTERM/SIGINT to this process become SIGTERM to each worker still running, which ends its run early; this
    process goes on collecting their results. Returns the handlers to put back. (A terminal's Ctrl-C reaches the
    workers too, as the same process group; a second signal to a worker that is already stopping changes nothing.)"""

    def forward(signum: int, frame: object) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)

    restore: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            restore[signum] = signal.signal(signum, forward)
    return restore


def run(
    config: LoadConfig,
    *,
    workers: int = 1,
    progress: Callable[[list[Progress]], None] | None = None,
    use_uvloop: bool = True,
    stop_on_signals: bool = False,
    started: Callable[[list[int]], None] | None = None,
) -> RunResult:
    """``stop_on_signals``: SIGTERM (and SIGINT, unless ignored) ends the run early in every worker, each hanging
    up its calls, and the merged result of what ran is returned (``RunResult.interrupted``).

    ``started`` is called once with the worker processes' PIDs when they have started (not when ``workers`` is
    1: the run is then in this process). They are reaped here before ``run`` returns; a caller that signals
    them must not reap them."""
    if workers < 1:
        raise LoadConfigError("workers must be >= 1")
    if workers > config.total_calls or workers > config.calls:
        raise LoadConfigError(f"{workers} workers for {config.total_calls} calls: use fewer workers")
    if workers == 1:

        def relay(p: Progress) -> None:
            if progress is not None:
                progress([p])

        return run_coroutine(run_load(config, progress=relay, stop_on_signals=stop_on_signals), use_uvloop=use_uvloop)

    context = multiprocessing.get_context("spawn")
    channel = context.Queue()
    processes = [
        context.Process(
            target=_worker_main,
            args=(config.share(i, workers), i, channel, use_uvloop, stop_on_signals),
            name=f"loadtest-{i}",
            daemon=True,
        )
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    restore = _forward_signals(processes) if stop_on_signals else {}
    latest: dict[int, Progress] = {}
    results: dict[int, RunResult] = {}
    errors: dict[int, str] = {}
    give_up = time.monotonic() + config.hard_deadline_s + _PARENT_GRACE_S
    try:
        if started is not None:
            started([process.pid for process in processes if process.pid is not None])
        while len(results) + len(errors) < workers:
            if time.monotonic() > give_up:
                raise LoadWorkerError("load workers did not finish within their deadline")
            try:
                kind, index, payload = channel.get(timeout=0.5)
            except queue.Empty:
                dead = [i for i, p in enumerate(processes) if not p.is_alive() and i not in results and i not in errors]
                for i in dead:
                    # a worker that died without a word (killed, out of memory)
                    errors[i] = f"worker {i} exited with code {processes[i].exitcode}"
                continue
            if kind == "progress":
                latest[index] = payload
                if progress is not None:
                    progress(list(latest.values()))
            elif kind == "result":
                results[index] = payload
            else:
                errors[index] = payload
    finally:
        for signum, handler in restore.items():
            signal.signal(signum, handler)
        for process in processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
    if errors:
        raise LoadWorkerError("\n".join(errors[i] for i in sorted(errors)))
    return merge([results[i] for i in sorted(results)])
