"""``gateway bench cluster``: calls per core and call setup with two workers behind Kamailio, against one worker
taken directly, in one run.

Processes (all on this machine, loopback only, each stopped by its PID at the end, Ctrl-C and SIGTERM too):

- ``gateway fake-provider --record none``: the AI leg (echo mode, the full websocket + JSON + base64 path of the
  OpenAI adapter), shared by both workers;
- ``gateway control`` with a routes file sending every call to that provider (``--redis``: Redis-backed, with a
  ``redis-server`` of its own);
- two ``gateway worker`` processes registered with it (admission through the control plane on every INVITE,
  heartbeats every second), pinned to ``--worker-cores`` (both on one CPU by default);
- Kamailio with deploy/kamailio/dispatcher.cfg and the two workers in its dispatcher list
  (:mod:`bench.kamailio`);
- the load generator: this process (:class:`~gateway.loadtest.runner.LoadRunner`).

Everything but the workers is pinned to ``--load-cores``. On a 2-CPU machine the workers cannot have a core
each, so the figures are CPU time per process (psutil), not wall-clock capacity: µs of a worker's CPU per call
per 20 ms frame, the unit of ``gateway bench calls``.

Per size N and repeat, two *phases*, their order alternating from repeat to repeat:

- ``direct``: N calls at ``--cps`` straight to the first worker's SIP port;
- ``kamailio``: the same N calls to Kamailio, which spreads them over both workers.

Each call lasts until the window has closed (as in ``gateway bench calls``: ramp, a grace for the last answers,
a settle second or two, then the ``--window``). Measured per phase: each call's setup (INVITE sent -> 200 OK
received, at the generator), each worker's calls (its own setup histogram), CPU per call-frame and tick overruns
over the window, the mean of the workers' own setup time (INVITE received -> 200 OK sent), Kamailio's, the control
plane's (and Redis's) CPU per call over the whole phase less their idle rate (measured once, before the first
phase), the control plane's admissions refused, failed calls by status, loss, and whether every call's audio came
back (the echo check of :mod:`gateway.loadtest.callanalysis`). The figures of :mod:`bench.cluster_figures`
are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import arguments
from bench import cluster_figures as figures
from bench.kamailio import DEFAULT_CONFIG, Balancer, BalancerError, missing_tools
from bench.processes import BenchProcess, cpus_named, free_port, pin
from gateway.compiled import ENV as ENV_COMPILED
from gateway.loadtest.config import CODECS, LoadConfig
from gateway.loadtest.results import aggregate
from gateway.loadtest.runner import LoadRunner

log = logging.getLogger(__name__)

DEFAULT_SIZES = (50, 100, 200)
MAX_CALLS = 1000
WORKER_IDS = ("bench-w1", "bench-w2")
_TOKEN = "bench-cluster-token-0123456789"
_UP_GRACE_S = 3.0  # after the ramp, the window opens even if some calls never came up
_SETTLE_S = 2.0
_TAIL_S = 2.0
_IDLE_WITHIN_S = 30.0
_ROUTES = """
[limits]
max_calls = {max_calls}

[fleet]
heartbeat_interval_s = 1.0

[[routes]]
name = "bench"
did = "*"
profile = "bench"

[profiles.bench]
provider = "openai"
audio_format = "pcm24k"
"""


class ClusterBenchError(RuntimeError):
    """A process of the cluster did not start or ended during the run; the message says which and how."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterBenchConfig:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    cps: float = 20.0  # the fixed call rate of every phase (setup latency is compared at it)
    window_s: float = 10.0
    repeats: int = 3
    codec: str = "PCMU"
    worker_cores: tuple[int, ...] | None = (0,)  # worker i on worker_cores[i % len] (None: not pinned)
    load_cores: tuple[int, ...] | None = (1,)  # everything else (None: not pinned)
    redis: bool = False
    kamailio_config: Path = field(default=DEFAULT_CONFIG)
    kamailio_children: int = 2
    idle_s: float = 5.0
    compiled: str | None = None
    uvloop: bool = True

    def __post_init__(self) -> None:
        if not self.sizes or any(not 2 <= n <= MAX_CALLS for n in self.sizes):
            raise ValueError(f"every size must be 2-{MAX_CALLS} calls (two workers take a share each)")
        if not (math.isfinite(self.cps) and 0 < self.cps <= 200):
            raise ValueError("the call rate must be within (0, 200] calls per second")
        if not 2 <= self.window_s <= 300:
            raise ValueError("the window must be 2-300 s")
        if not 1 <= self.repeats <= 20:
            raise ValueError("repeats must be 1-20")
        if not 1 <= self.kamailio_children <= 16:
            raise ValueError("Kamailio's children must be 1-16")
        if not 1 <= self.idle_s <= 60:
            raise ValueError("the idle measurement must be 1-60 s")

    def phase_bound_s(self, calls: int) -> float:
        """How long one phase can take at most: the load's own hard deadline and the wait for idle workers."""
        ramp = calls / self.cps
        return ramp + self.call_s(calls) + 10.0 + 15.0 + _IDLE_WITHIN_S

    def call_s(self, calls: int) -> float:
        """Each call's length from its answer: the window closes before the first call ends."""
        return calls / self.cps + _UP_GRACE_S + _SETTLE_S + self.window_s + _TAIL_S


@dataclass(slots=True)
class _Worker:
    id: str
    sip_port: int
    api_port: int
    process: BenchProcess


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k != "OPENAI_API_KEY"}
    return {**env, "GATEWAY_API_TOKEN": _TOKEN, "PYTHONUNBUFFERED": "1", **extra}


def _ready(process: BenchProcess, pattern: str, within: float) -> re.Match[str]:
    """The ready line of ``process``; ClusterBenchError (with its log's end) when it exits or is late."""
    try:
        return process.wait_for(pattern, within)
    except (RuntimeError, TimeoutError) as exc:
        raise ClusterBenchError(str(exc)) from None


class ClusterBench:
    """The cluster's processes and the measured phases (see the module docstring)."""

    def __init__(self, config: ClusterBenchConfig, *, directory: Path) -> None:
        self.config = config
        self.directory = directory
        self.fake: BenchProcess | None = None
        self.redis: BenchProcess | None = None
        self.control: BenchProcess | None = None
        self.control_port = 0
        self.workers: list[_Worker] = []
        self.balancer: Balancer | None = None
        self.idle_rates: dict[str, float] = {}
        self._headers = {"Authorization": f"Bearer {_TOKEN}"}

    # ------------------------------------------------------------------------------ processes

    def _started(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> BenchProcess:
        process = BenchProcess(name, argv, self.directory, env=env or _env())
        if name.startswith("worker"):
            cores = self.config.worker_cores
            pin(process.popen.pid, cores[len(self.workers) % len(cores)] if cores else None)
        else:
            pin(process.popen.pid, self.config.load_cores)
        return process

    def start(self) -> None:
        """Start every process and wait (each bounded) until the workers are registered and Kamailio's probes
        found both answering."""
        c = self.config
        python = [sys.executable]
        fake_port = free_port()
        fake_argv = [*python, "-m", "gateway", "fake-provider", "--port", str(fake_port), "--record", "none"]
        if not c.uvloop:
            fake_argv.append("--no-uvloop")
        self.fake = self._started("fake-provider", fake_argv)
        openai_url = _ready(self.fake, r"listening (\S+)", 30).group(1)
        extra: dict[str, str] = {}
        if c.redis:
            redis_port = free_port()
            (self.directory / "redis").mkdir()
            argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--dir"]
            argv += [str(self.directory / "redis"), "--save", "", "--appendonly", "no", "--daemonize", "no"]
            self.redis = self._started("redis", argv)
            _ready(self.redis, r"Ready to accept connections", 15)
            extra["GATEWAY_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        routes = self.directory / "routes.toml"
        routes.write_text(_ROUTES.format(max_calls=4 * max(c.sizes)))
        self.control_port = free_port()
        argv = [*python, "-m", "gateway", "control", "--port", str(self.control_port), "--config", str(routes)]
        self.control = self._started("control", [*argv, "--log-level", "warning"], env=_env(**extra))
        self._wait_http(self.control, f"{self.control_url}/healthz", 30)
        worker_env = _env(
            GATEWAY_OPENAI_URL=openai_url,
            # The load generator and Kamailio are each one source: the per-source limit is not under test here.
            GATEWAY_SIP_RATE_LIMIT_PER_S="100000",
            **({ENV_COMPILED: c.compiled} if c.compiled else {}),
        )
        for index, worker_id in enumerate(WORKER_IDS):
            sip_port, api_port = free_port(kind=socket.SOCK_DGRAM), free_port()
            low = 20000 + 5000 * index
            argv = [*python, "-m", "gateway", "worker", "--control", self.control_url, "--worker-id", worker_id]
            argv += ["--sip-port", str(sip_port), "--api-port", str(api_port), "--rtp-ports", f"{low}-{low + 4999}"]
            # Capacity above every size: admission is part of each setup, but no call is refused for capacity.
            argv += ["--capacity", str(2 * max(c.sizes)), "--provider", "openai", "--log-level", "warning"]
            if not c.uvloop:
                argv.append("--no-uvloop")
            process = self._started(f"worker-{index + 1}", argv, env=worker_env)
            self.workers.append(_Worker(id=worker_id, sip_port=sip_port, api_port=api_port, process=process))
        for worker in self.workers:  # ready: registered with the control plane
            self._wait_http(worker.process, f"http://127.0.0.1:{worker.api_port}/readyz", 60)
        self.balancer = Balancer(
            workers=[f"sip:127.0.0.1:{w.sip_port}" for w in self.workers],
            directory=self.directory,
            config=c.kamailio_config,
            children=c.kamailio_children,
            cores=c.load_cores,
        )
        try:
            self.balancer.start()
            self.balancer.wait_active(within=15)
        except BalancerError as exc:
            raise ClusterBenchError(f"Kamailio: {exc}") from None
        pin(0, c.load_cores)

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def _wait_http(self, process: BenchProcess, url: str, within: float) -> None:
        """Until ``url`` answers 200 (bounded); a process that exits meanwhile is reported with its log."""
        deadline = time.monotonic() + within
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                report = process.exit_report()
                if report is not None:
                    raise ClusterBenchError(report)
                with contextlib.suppress(httpx.TransportError):
                    if client.get(url).status_code == 200:
                        return
                time.sleep(0.1)
        raise ClusterBenchError(
            f"{process.name} not ready within {within:.0f} s ({url}); its log ends:\n{process.log_tail()}"
        )

    def stop(self) -> None:
        """Stop every process this bench started, the load side's first (each by its PID; bounded)."""
        if self.balancer is not None:
            self.balancer.stop()
        for worker in self.workers:
            worker.process.stop()
        for process in (self.control, self.redis, self.fake):
            if process is not None:
                process.stop()

    def _check_alive(self) -> None:
        for process in (self.fake, self.redis, self.control, *(w.process for w in self.workers)):
            report = process.exit_report() if process is not None else None
            if report is not None:
                raise ClusterBenchError(report)
        if self.balancer is not None and self.balancer.process is not None:
            report = self.balancer.process.exit_report()
            if report is not None:
                raise ClusterBenchError(report)

    # ------------------------------------------------------------------------------ measuring

    def _helper_cpu(self) -> dict[str, float]:
        """CPU seconds so far of the processes that are neither a worker nor this one."""
        assert self.balancer is not None and self.control is not None
        spent = {"kamailio": self.balancer.cpu_s(), "control": self.control.cpu_s()}
        if self.redis is not None:
            spent["redis"] = self.redis.cpu_s()
        return spent

    async def _samples(self, client: httpx.AsyncClient, url: str) -> figures.Samples:
        try:
            response = await client.get(url, headers=self._headers)
        except httpx.TransportError:
            self._check_alive()  # a process gone is the news, not the network error
            raise
        response.raise_for_status()
        return figures.parse_samples(response.text)

    async def _worker_samples(self, client: httpx.AsyncClient) -> list[figures.Samples]:
        return list(
            await asyncio.gather(
                *(self._samples(client, f"http://127.0.0.1:{w.api_port}/metrics") for w in self.workers)
            )
        )

    async def _wait_idle(self, client: httpx.AsyncClient) -> None:
        """Until no worker reports an active call (bounded): the next phase starts from idle workers."""
        deadline = time.monotonic() + _IDLE_WITHIN_S
        while time.monotonic() < deadline:
            samples = await self._worker_samples(client)
            if all(figures.total(s, "gateway_active_calls") <= 0 for s in samples):
                return
            await asyncio.sleep(0.25)
        log.warning("the workers still held calls %.0f s after the load ended", _IDLE_WITHIN_S)

    async def measure_idle(self) -> None:
        """The idle CPU rate (CPU s per s) of Kamailio, the control plane, Redis and each worker: OPTIONS probes,
        heartbeats, the media clock and timers with no call up. The helpers' per-call figures are net of it; the
        workers' are not (as in ``gateway bench calls``), and the report shows what a worker spends idle."""
        before, t0 = self._helper_cpu(), time.monotonic()
        workers_before = [w.process.cpu_s() for w in self.workers]
        await asyncio.sleep(self.config.idle_s)
        after, t1 = self._helper_cpu(), time.monotonic()
        workers_after = [w.process.cpu_s() for w in self.workers]
        self.idle_rates = {name: (after[name] - before[name]) / (t1 - t0) for name in before}
        self.idle_rates |= {
            w.id: (workers_after[i] - workers_before[i]) / (t1 - t0) for i, w in enumerate(self.workers)
        }

    async def warm_up(self, client: httpx.AsyncClient) -> None:
        """A few short calls through Kamailio first (they land on both workers): a worker's first call imports and
        builds what later calls reuse."""
        assert self.balancer is not None
        load = LoadConfig(
            target=("127.0.0.1", self.balancer.port),
            calls=6,
            cps=10.0,
            duration_s=3.0,
            codec=self.config.codec,  # type: ignore[arg-type]
            rtp_ports=(40000, 40199),
            analyze=False,
        )
        await LoadRunner(load).run()
        await self._wait_idle(client)

    def _target(self, placement: str) -> tuple[str, int]:
        assert self.balancer is not None
        if placement == "direct":
            return ("127.0.0.1", self.workers[0].sip_port)
        return ("127.0.0.1", self.balancer.port)

    async def phase(self, client: httpx.AsyncClient, placement: str, calls: int) -> dict[str, Any]:
        """``calls`` calls placed at the configured rate, directly or through Kamailio, measured (module docstring)."""
        c = self.config
        ramp_s = calls / c.cps
        load = LoadConfig(
            target=self._target(placement),
            calls=calls,
            total=calls,
            cps=c.cps,
            duration_s=c.call_s(calls),
            codec=c.codec,  # type: ignore[arg-type]
            rtp_ports=(40000, 40000 + 2 * calls + 99),
            setup_timeout_s=10.0,
        )
        start = await self._worker_samples(client)
        control_before = await self._samples(client, f"{self.control_url}/metrics")
        helpers_before, t_start = self._helper_cpu(), time.monotonic()
        load_1m = os.getloadavg()[0]  # how busy the machine was as the phase began (other tenants included)
        all_up = asyncio.Event()
        runner = LoadRunner(load, progress=lambda p: all_up.set() if p.up >= calls else None)
        task = asyncio.create_task(runner.run(), name=f"bench-cluster-{placement}-{calls}")
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_up.wait(), timeout=ramp_s + _UP_GRACE_S)
            await asyncio.sleep(_SETTLE_S)
            window_open, t0 = await self._worker_samples(client), time.monotonic()
            cpu_open, helpers_open = [w.process.cpu_s() for w in self.workers], self._helper_cpu()
            await asyncio.sleep(c.window_s)
            window_close, t1 = await self._worker_samples(client), time.monotonic()
            cpu_close, helpers_close = [w.process.cpu_s() for w in self.workers], self._helper_cpu()
            result = await task
        finally:
            if not task.done():  # interrupted, or a process died: hang up what is up, bounded by its deadline
                runner.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, timeout=20)
        await self._wait_idle(client)
        end = await self._worker_samples(client)
        control_after = await self._samples(client, f"{self.control_url}/metrics")
        helpers_after, t_end = self._helper_cpu(), time.monotonic()
        self._check_alive()
        targets_active = None
        if placement == "kamailio" and self.balancer is not None:
            targets = await asyncio.to_thread(self.balancer.targets)
            targets_active = sum(1 for t in targets if t.probed_active)
        windows = [
            figures.WorkerWindow(
                worker_id=w.id,
                start=start[i],
                window_open=window_open[i],
                window_close=window_close[i],
                end=end[i],
                cpu_open_s=cpu_open[i],
                cpu_close_s=cpu_close[i],
            )
            for i, w in enumerate(self.workers)
        ]
        helpers = {
            name: figures.PhaseCpu(cpu_s=helpers_after[name] - helpers_before[name], idle_rate=self.idle_rates[name])
            for name in helpers_before
        }
        helpers_window = {
            name: figures.PhaseCpu(cpu_s=helpers_close[name] - helpers_open[name], idle_rate=self.idle_rates[name])
            for name in helpers_open
        }
        return figures.phase_row(
            placement=placement,
            calls=calls,
            summary=aggregate(result),
            setup_ms=[call.setup_ms for call in result.calls],
            workers=windows,
            window_s=t1 - t0,
            phase_s=t_end - t_start,
            helpers=helpers,
            helpers_window=helpers_window,
            load_1m=load_1m,
            control_before=control_before,
            control_after=control_after,
            targets_active=targets_active,
            worker_idle_rates=[self.idle_rates[w.id] for w in self.workers],
        )

    async def run_all(self) -> dict[int, dict[str, list[dict[str, Any]]]]:  # by size, then placement
        """Every size, ``repeats`` times each placement, the order of the two alternating from repeat to repeat."""
        runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
        async with httpx.AsyncClient(timeout=5.0) as client:
            await self.warm_up(client)
            await self.measure_idle()
            for calls in self.config.sizes:
                runs[calls] = {placement: [] for placement in figures.PLACEMENTS}
                for repeat in range(self.config.repeats):
                    order = figures.PLACEMENTS if repeat % 2 == 0 else figures.PLACEMENTS[::-1]
                    for placement in order:
                        row = await self.phase(client, placement, calls)
                        runs[calls][placement].append(row)
                        print(_progress_line(row, repeat), file=sys.stderr, flush=True)
        return runs


def _progress_line(row: dict[str, Any], repeat: int) -> str:
    landed = " / ".join(f"{v:.0f}" for v in row["landed"])
    us = " / ".join("-" if not math.isfinite(v) else f"{v:.0f}" for v in row["worker_us"])
    return (
        f"  {row['calls']} calls {row['placement']} (run {repeat + 1}): answered {row['answered']}, "
        f"per worker {landed}, µs/call/20ms {us}, setup p50/p95/p99 {row['setup_p50_ms']:.1f}/"
        f"{row['setup_p95_ms']:.1f}/{row['setup_p99_ms']:.1f} ms, echo {row['audio_ok']}/{row['audio_checked']}, "
        f"overruns {row['overruns']:.0f}, generator ticks skipped {row['generator_skipped']}, "
        f"load average {row['load_1m']:.2f}"
    )


def _run_loop(coro: Any, use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def missing(config: ClusterBenchConfig) -> list[str]:
    """What this machine lacks to run the benchmark, each with how to get it."""
    out = [f"{tool} (Debian: apt-get install kamailio)" for tool in missing_tools()]
    if config.redis and shutil.which("redis-server") is None:
        out.append("redis-server (Debian: apt-get install redis-server), for --redis")
    if not config.kamailio_config.is_file():
        out.append(f"the Kamailio configuration {config.kamailio_config} (give one with --kamailio-config)")
    return out


def run(config: ClusterBenchConfig, *, json_path: str | None = None) -> int:
    """Run the benchmark and print the table; returns the exit status (2: something needed is missing)."""
    logging.basicConfig(level="WARNING")
    lacking = missing(config)
    if lacking:
        print("gateway bench cluster: cannot run here; missing: " + "; ".join(lacking), file=sys.stderr)
        return 2
    bound = sum(2 * config.repeats * config.phase_bound_s(n) for n in config.sizes)
    print(
        f"gateway bench cluster: sizes {', '.join(map(str, config.sizes))} at {config.cps:g} calls/s, "
        f"{config.repeats} repeats, stops by itself within {bound / 60:.0f} min",
        file=sys.stderr,
        flush=True,
    )
    load_before = os.getloadavg()
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as work:
            bench = ClusterBench(config, directory=Path(work))
            try:
                bench.start()
                runs = _run_loop(bench.run_all(), config.uvloop)
            finally:
                bench.stop()
            idle = bench.idle_rates
    except KeyboardInterrupt:
        print(
            "gateway bench cluster: interrupted; Kamailio, the workers, the control plane and the fake provider "
            "are stopped",
            file=sys.stderr,
        )
        return 130
    except ClusterBenchError as exc:
        print(f"gateway bench cluster: no result: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    load_after = os.getloadavg()
    return _report(config, runs, idle, load_before=load_before[0], load_after=load_after[0], json_path=json_path)


def _report(
    config: ClusterBenchConfig,
    runs: dict[int, dict[str, list[dict[str, Any]]]],
    idle: dict[str, float],
    *,
    load_before: float,
    load_after: float,
    json_path: str | None,
) -> int:
    rows = [figures.median_row(runs[calls][placement]) for calls in runs for placement in figures.PLACEMENTS]
    comparisons = [
        figures.compare(figures.median_row(runs[calls]["direct"]), figures.median_row(runs[calls]["kamailio"]))
        for calls in runs
    ]
    workers = cpus_named(config.worker_cores)
    print(
        f"gateway bench cluster: {config.codec} calls at {config.cps:g} calls/s, fake OpenAI over websocket, "
        f"window {config.window_s:g} s, repeats {config.repeats}, control plane "
        f"{'Redis-backed' if config.redis else 'in memory'}, Kamailio {config.kamailio_children} children, "
        f"{'compiled ' + config.compiled if config.compiled else 'source'} workers; "
        f"cpus: {os.cpu_count()}, workers pinned to {workers}, the rest to {cpus_named(config.load_cores)}; "
        f"load average before/after: {load_before:.2f}/{load_after:.2f}"
    )
    print("CPU is measured per process (CPU time, not wall-clock capacity): " + _placement_note(config.worker_cores))
    print(
        "idle, no call up (% of a core): "
        + ", ".join(f"{name} {100 * rate:.1f}" for name, rate in idle.items())
        + " (the workers' µs/call/20ms include it, 'net of idle' does not; the others' figures are net of it)"
    )
    print(figures.table(rows, redis=config.redis))
    for line in figures.comparison_lines(comparisons, config.repeats):
        print(line)
    pairs = figures.equal_per_worker(rows)
    for line in figures.equal_per_worker_lines(pairs):
        print(line)
    print(
        "setup = INVITE sent -> 200 OK received at the generator (p99 of fewer than 100 calls is near the max); "
        "in worker = INVITE received -> 200 OK sent, mean; kamailio/control/redis µs per call: CPU over the "
        "phase less the idle rate; control µs/call-s: the control plane's CPU per live call per second over the "
        "window (heartbeats), less idle; load: the 1-minute load average as each phase began (median); "
        "gen skipped: ticks the generator's clock skipped (its callers' audio has gaps then: the echo check "
        "measures the load side too)"
    )
    failed = sum(row["failed"] for row in rows)
    echo_bad = sum(row["audio_checked"] - row["audio_ok"] for row in rows)
    spread = [row for row in rows if row["placement"] == "kamailio" and min(row["landed"]) <= 0]
    if json_path:
        document = {
            "config": {
                "sizes": list(config.sizes),
                "cps": config.cps,
                "window_s": config.window_s,
                "repeats": config.repeats,
                "codec": config.codec,
                "redis": config.redis,
                "kamailio_children": config.kamailio_children,
                "worker_cores": cpus_named(config.worker_cores),
                "load_cores": cpus_named(config.load_cores),
                "compiled": config.compiled,
                "cpus": os.cpu_count(),
                "load_average_before_after": [load_before, load_after],
            },
            "idle_core_fraction": idle,
            "rows": [_finite(row) for row in rows],
            "runs": {str(calls): {p: [_finite(r) for r in rs] for p, rs in by.items()} for calls, by in runs.items()},
            "comparisons": [_finite(c) for c in comparisons],
            "equal_calls_per_worker": [_finite(p) for p in pairs],
        }
        Path(json_path).write_text(json.dumps(document, indent=2))
    if failed or echo_bad or spread:
        print(
            f"not clean: {failed} calls failed, {echo_bad} calls' audio did not come back right, "
            f"{len(spread)} sizes through Kamailio left a worker without calls",
            file=sys.stderr,
        )
    return 0


def _placement_note(worker_cores: tuple[int, ...] | None) -> str:
    if worker_cores is None:
        return (
            "the workers are not pinned, so a worker's µs per call-frame is what its calls cost, not what a core "
            "would hold."
        )
    if len(set(worker_cores)) == 1:
        return (
            "both workers share one CPU here, so a worker's µs per call-frame is what its calls cost, not what a "
            "core it had to itself would hold."
        )
    return f"the workers are pinned to CPUs {', '.join(map(str, worker_cores))} in turn."


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calls",
        type=arguments.sizes,
        default=(50, 100, 200),
        help="comma-separated sizes, calls in all (default 50,100,200)",
    )
    parser.add_argument("--cps", type=float, default=20.0, help="call rate of every phase (default 20)")
    parser.add_argument("--window", type=float, default=10.0, help="measurement window per phase, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each placement per size (medians reported)")
    parser.add_argument("--codec", choices=["pcmu", "pcma", "g722", "opus"], default="pcmu", help="codec of every call")
    parser.add_argument(
        "--worker-cores",
        type=arguments.cpus,
        default=(0,),
        help="CPUs of the two workers: 0 (both on CPU 0), 2,3 (one each) ... (-1: not pinned)",
    )
    parser.add_argument(
        "--load-cores",
        type=arguments.cpus,
        default=(1,),
        help="CPUs of Kamailio, the control plane, the fake provider and the generator (-1: not pinned)",
    )
    parser.add_argument("--redis", action="store_true", help="a Redis-backed control plane (starts redis-server)")
    parser.add_argument(
        "--kamailio-config", metavar="FILE", help="Kamailio configuration (default: deploy/kamailio/dispatcher.cfg)"
    )
    parser.add_argument("--kamailio-children", type=int, default=2, help="Kamailio's SIP worker processes")
    parser.add_argument(
        "--compiled", metavar="DIR", help="run the workers on the `gateway compile` build in DIR (GATEWAY_COMPILED)"
    )
    parser.add_argument("--json", metavar="FILE", help="write every run and the medians as JSON")
    parser.add_argument("--no-uvloop", action="store_true", help="stdlib asyncio loop in workers, generator, fake")


def main(args: argparse.Namespace) -> int:
    try:
        cluster_config = ClusterBenchConfig(
            sizes=args.calls,
            cps=args.cps,
            window_s=args.window,
            repeats=args.repeats,
            codec=CODECS[args.codec],
            worker_cores=args.worker_cores or None,
            load_cores=args.load_cores or None,
            redis=args.redis,
            kamailio_config=Path(args.kamailio_config) if args.kamailio_config else DEFAULT_CONFIG,
            kamailio_children=args.kamailio_children,
            compiled=args.compiled,
            uvloop=not args.no_uvloop,
        )
    except ValueError as exc:
        print(f"gateway bench cluster: {exc}", file=sys.stderr)
        return 2
    return run(cluster_config, json_path=args.json)
