"""``gateway bench calls``: how many bridged calls one media worker core carries, with the AI leg active.

Processes (all on this machine, loopback only, stopped by PID at the end):

- the worker under test: ``python -m bench._worker`` (the production MediaWorker without the
  control plane), pinned to one core (``--worker-core``) with ``sched_setaffinity``;
- ``gateway fake-provider --record none`` (echo mode: every caller turn comes back through the full
  websocket + JSON + base64 path of the OpenAI adapter), pinned to the other core (``--load-core``, one CPU or
  a list); ``--fakes N`` runs N of them on one port (SO_REUSEPORT), the kernel spreading the calls' connections;
- the load generator: this process (:class:`~gateway.loadtest.runner.LoadRunner`), pinned with the fake; with
  ``--load-workers N``, N processes (:mod:`gateway.loadtest.multi`) sharing the calls, this process collecting.

On this 2-CPU machine the load side has one CPU, which one fake and one generator fill at about 250 calls.
``--fakes`` and ``--load-workers`` with a list of load CPUs let a larger host load one worker core further.

Per concurrency step N: N calls are placed at ``--ramp-cps``; once all are up (plus a settle second) the
measurement window opens for ``--window`` seconds. Over the window: the worker's CPU from its own counters
(psutil), tick duration p99, overruns and skipped ticks from its ``/metrics`` (histogram deltas: p99 is the upper
edge of its bucket), the gateway-added delay per direction ("in wait": a caller packet's arrival -> its frame
handed to the provider connection; "out wait": a provider item's first audio -> its first frame sent; means from
the worker's histograms), and the fake's and the generator's CPU (if either saturates, the step measured them, not
the worker). Over the whole call: loss, outbound pacing error (from the kernel's receive stamps at the generator, on
loopback the worker's send times; the generator's own read delay is reported beside it, see
:mod:`gateway.loadtest.callanalysis`), marker round trip, whether every call's audio came back. A step is
*sustained* when every call was answered, nothing was lost, pacing error p99 <= 10 ms, no tick overran and every
call's audio came back. ``--repeats`` runs each step several times; the table shows medians.
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
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import arguments, census
from bench.processes import BenchProcess, cpus_named, free_port, pin, renice
from gateway.compiled import ENV as ENV_COMPILED
from gateway.loadtest.config import CODECS, LoadConfig, TalkPattern
from gateway.loadtest.multi import run as run_load_processes
from gateway.loadtest.results import CallResult, Progress, RunResult, aggregate
from gateway.loadtest.runner import LoadRunner

log = logging.getLogger(__name__)

DEFAULT_STEPS = (50, 100, 200, 300, 400, 600, 800)
QUICK_STEPS = (20, 50)
PACING_LIMIT_MS = 10.0
_SETTLE_S = 2.0
_UP_GRACE_S = 3.0  # after the ramp, the window opens even if some calls never came up
_TAIL_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CallsBenchConfig:
    steps: tuple[int, ...] = DEFAULT_STEPS
    codec: str = "PCMU"
    engine: str = "batched"  # or "percall"
    provider: str = "openai"  # the fake server through the OpenAI adapter; or "echo" (no websocket)
    chunk_ms: int = 20
    quiet_chunk_ms: int = 100  # caller audio per message once the caller has been quiet for a second
    provider_format: str = "pcm24k"  # or "pcmu": the profile's audio_format (G.711 passthrough to the provider)
    window_s: float = 20.0
    ramp_cps: float = 50.0
    repeats: int = 1
    worker_core: int | None = 0
    load_core: tuple[int, ...] | None = (1,)  # the CPUs of the fakes and the generator (None: any)
    fakes: int = 1  # fake provider processes on one port (SO_REUSEPORT)
    load_workers: int = 1  # load generator processes (1: in this process)
    profile: str | None = None  # cProfile output of the worker
    stop_after_failures: int = 2  # consecutive unsustained steps before stepping stops
    talk: TalkPattern = field(default_factory=TalkPattern)
    uvloop: bool = True
    nice: int = 0  # niceness of the worker, the fake and the generator (negative needs root)
    rtp_base: int = 40000  # first UDP port of the generator's RTP range (another bench on the machine may hold it)
    compiled: str | None = None  # a `gateway compile` build the worker runs on (GATEWAY_COMPILED)
    against_source: bool = False  # with `compiled`: each repeat also runs the source worker, interleaved
    srtp: str | None = None  # an SDES suite: each repeat runs the calls over plain RTP and then over SRTP
    calls_srtp: str | None = None  # the suite this run's calls use (set per variant by _variants)
    gc_census: bool = False  # the worker counts what its middle collector passes walk (bench.census)
    scrape_every_s: float = 0.0  # > 0: GET /metrics this often through the window, as a Prometheus server would
    metrics_render: str = "exposition"  # or "generate_latest": how the worker renders /metrics (one stretch)


_READ_METRICS = (
    "gateway_tick",
    "gateway_event_loop",
    "gateway_active_calls",
    "gateway_rtp",
    "gateway_caller_audio_wait",
    "gateway_agent_audio_wait",
    "gateway_playout_events",
    "gateway_agent_audio_gaps",
    "gateway_opus_encode_moves",
    "gateway_gc_pause",
)


def _parse_metrics(text: str) -> dict[str, float]:
    """Flat {sample name + labels: value} of a Prometheus text exposition (only what the bench reads)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        if key.startswith(_READ_METRICS):
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def _bucket_p99(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float, int, float]:
    """(p99 upper bucket edge in ms, observations, mean ms) of a histogram over an interval."""
    buckets: list[tuple[float, float]] = []
    for key, value in after.items():
        if key.startswith(f"{name}_bucket"):
            le = re.search(r'le="([^"]+)"', key)
            if le:
                edge = math.inf if le.group(1) == "+Inf" else float(le.group(1))
                buckets.append((edge, value - before.get(key, 0.0)))
    buckets.sort()
    count = buckets[-1][1] if buckets else 0.0
    total = sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(f"{name}_sum"))
    if count <= 0:
        return math.nan, 0, math.nan
    for edge, cumulative in buckets:
        if cumulative >= 0.99 * count:
            return edge * 1000, int(count), total / count * 1000
    return math.inf, int(count), total / count * 1000


def _steal_s(core: int | None) -> float | None:
    """Seconds of CPU stolen by the hypervisor so far: on ``core``, or averaged over all (None off Linux)."""
    try:
        if core is None:
            return float(psutil.cpu_times().steal) / (psutil.cpu_count() or 1)
        return float(psutil.cpu_times(percpu=True)[core].steal)
    except (AttributeError, IndexError):
        return None


def _cpu_s(processes: list[psutil.Process]) -> float:
    """CPU seconds of ``processes`` so far (one that has ended counts nothing)."""
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def _stop(processes: list[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM to those of ``processes`` still running, SIGKILL to any left after ``grace``. They are not reaped
    here: multiprocessing reaps its own children, and one reaped behind its back looks alive to it. (psutil
    checks each one's start time before it signals, so a PID reused since is left alone.)"""
    running = [process for process in processes if _running(process)]
    for process in running:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    deadline = time.monotonic() + grace
    while running and time.monotonic() < deadline:
        running = [process for process in running if _running(process)]
        if running:
            time.sleep(0.05)
    for process in running:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _counter(before: dict[str, float], after: dict[str, float], prefix: str, having: str = "") -> float:
    """Growth over the interval of every sample named ``prefix...`` whose labels include ``having``."""
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix) and having in k)


def _collector_passes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The worker's middle and full collector passes over the interval, and the middle ones' mean in ms."""
    middle = _counter(before, after, "gateway_gc_pause_seconds_count", 'generation="1"')
    middle_s = _counter(before, after, "gateway_gc_pause_seconds_sum", 'generation="1"')
    return {
        "gc_middle_passes": middle,
        "gc_middle_mean_ms": 1000 * middle_s / middle if middle else 0.0,
        "gc_full_passes": _counter(before, after, "gateway_gc_pause_seconds_count", 'generation="2"'),
    }


class WorkerExitedError(RuntimeError):
    """The worker under test ended during a run (a crash, or killed): the message says how, with its log's end."""


class CallsBench:
    def __init__(self, config: CallsBenchConfig, *, directory: Path) -> None:
        self.config = config
        self.directory = directory
        self.fakes: list[BenchProcess] = []
        self.worker: BenchProcess | None = None
        self.pinned = False
        self.steal_core: int | None = None
        self.media_plane = ""
        self.load_processes: list[psutil.Process] = []  # this step's --load-workers processes, as they started
        self.census_path = directory / "gc-census.jsonl"

    # ------------------------------------------------------------------------------ processes

    def start(self) -> None:
        c = self.config
        argv_worker_extra: list[str] = []
        if c.provider == "openai":
            fake_port = free_port()
            fake_argv = [sys.executable, "-m", "gateway", "fake-provider", "--port", str(fake_port), "--record", "none"]
            if c.fakes > 1:
                fake_argv.append("--reuse-port")
            if not c.uvloop:
                fake_argv.append("--no-uvloop")
            url = ""
            for index in range(c.fakes):
                name = "fake-provider" if c.fakes == 1 else f"fake-provider-{index}"
                fake = BenchProcess(name, fake_argv, self.directory)
                self.fakes.append(fake)
                url = fake.wait_for(r"listening (\S+)", 30).group(1)
                pin(fake.popen.pid, c.load_core)
                renice(fake.popen.pid, c.nice)
            argv_worker_extra = ["--openai-url", url]
        self.sip_port = free_port(kind=socket.SOCK_DGRAM)
        self.metrics_port = free_port()
        argv = [sys.executable]
        if c.profile and c.profile.endswith(".prof"):
            argv += ["-m", "cProfile", "-o", c.profile]
        argv += [
            "-m",
            "bench._worker",
            "--sip-port",
            str(self.sip_port),
            "--metrics-port",
            str(self.metrics_port),
            "--rtp-ports",
            "20000-29999",
            "--provider",
            c.provider,
            "--engine",
            c.engine,
            "--chunk-ms",
            str(c.chunk_ms),
            "--quiet-chunk-ms",
            str(c.quiet_chunk_ms),
            "--provider-format",
            c.provider_format,
            *argv_worker_extra,
        ]
        if c.gc_census:
            argv += ["--gc-census", str(self.census_path)]
        argv += ["--metrics-render", c.metrics_render]
        if not c.uvloop:
            argv.append("--no-uvloop")
        env = {k: v for k, v in os.environ.items() if k != ENV_COMPILED}
        if c.compiled:
            env[ENV_COMPILED] = c.compiled
        self.worker = BenchProcess("worker", argv, self.directory, env=env)
        ready = self.worker.wait_for(r"bench worker ready.*media plane: ([^\n]*)", 60)
        self.media_plane = ready.group(1)
        if c.compiled and (not self.media_plane.startswith("compiled") or "from source" in self.media_plane):
            raise RuntimeError(f"the worker did not load the whole build {c.compiled}: {self.media_plane}")
        self.pinned = pin(self.worker.popen.pid, c.worker_core)
        self.steal_core = c.worker_core if self.pinned else None
        pin(0, c.load_core)
        renice(self.worker.popen.pid, c.nice)
        renice(0, c.nice)

    def stop(self) -> None:
        _stop(self.load_processes)  # interrupted mid-step: the thread collecting them then ends too
        for proc in (self.worker, *self.fakes):
            if proc is not None:
                proc.stop()

    def _sampler(self, calls: int) -> subprocess.Popen[bytes] | None:
        """Sample the worker over this step's window: perf for ``--profile`` ending in .perf (it sees into the
        compiled build and the kernel), py-spy for any other name but .prof (cProfile)."""
        c = self.config
        if not c.profile or c.profile.endswith(".prof") or self.worker is None:
            return None
        if c.profile.endswith(".perf"):
            return self._perf(calls)
        binary = Path(sys.executable).with_name("py-spy")
        if not binary.exists():
            log.warning("py-spy not found next to %s: no profile", sys.executable)
            return None
        out = f"{c.profile}-{calls}.txt"
        argv = [str(binary), "record", "--pid", str(self.worker.popen.pid), "--duration", str(int(c.window_s))]
        argv += ["--rate", "200", "--format", "raw", "--nonblocking", "-o", out]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _perf(self, calls: int) -> subprocess.Popen[bytes] | None:
        assert self.config.profile is not None and self.worker is not None
        perf = shutil.which("perf")
        if perf is None:
            log.warning("perf not found (Debian: linux-perf): no profile")
            return None
        out = f"{self.config.profile}-{calls}.data"
        # 199 Hz (not a multiple of the 50 Hz tick) with 32 KiB of stack per sample: enough to unwind a tick.
        argv = [perf, "record", "-F", "199", "--call-graph", "dwarf,32768", "-p", str(self.worker.popen.pid)]
        argv += ["-o", out, "--", "sleep", str(self.config.window_s)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def _metrics(self, client: httpx.AsyncClient) -> dict[str, float]:
        try:
            response = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        except httpx.TransportError:
            report = self.worker.exit_report() if self.worker is not None else None
            if report is not None:  # not a network fault: the worker is gone, and how it went is the news
                raise WorkerExitedError(report) from None
            raise
        return _parse_metrics(response.text)

    async def _window(self, client: httpx.AsyncClient, seconds: float) -> int:
        """Wait out the measured window; with ``scrape_every_s``, scrape ``/metrics`` at that interval meanwhile
        (what a scrape costs the worker then shows in its overruns). Returns how many scrapes were made."""
        every = self.config.scrape_every_s
        if every <= 0:
            await asyncio.sleep(seconds)
            return 0
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        scrapes = 0
        while (left := end - loop.time()) > 0:
            await asyncio.sleep(min(every, left))
            if loop.time() < end:
                await self._metrics(client)
                scrapes += 1
        return scrapes

    async def _wait_idle(self, client: httpx.AsyncClient, within: float = 20.0) -> None:
        """Until the worker reports no active calls (bounded): the next step starts from a clean worker."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            metrics = await self._metrics(client)
            if sum(v for k, v in metrics.items() if k.startswith("gateway_active_calls")) <= 0:
                return
            await asyncio.sleep(0.25)

    # ------------------------------------------------------------------------------ one step

    async def step(self, calls: int, *, port_base: int) -> dict[str, Any]:
        c = self.config
        assert self.worker is not None
        cps = min(c.ramp_cps, float(calls))
        ramp_s = calls / cps
        duration = ramp_s + _UP_GRACE_S + _SETTLE_S + c.window_s + _TAIL_S
        load = LoadConfig(
            target=("127.0.0.1", self.sip_port),
            calls=calls,
            total=calls,
            cps=cps,
            duration_s=duration,
            codec=c.codec,  # type: ignore[arg-type]
            srtp=c.calls_srtp,
            talk=c.talk,
            rtp_ports=(port_base, port_base + 2 * calls + 99),
            setup_timeout_s=10.0,
        )
        all_up = asyncio.Event()
        async with httpx.AsyncClient(timeout=5.0) as client:
            m_start = await self._metrics(client)
            task = asyncio.create_task(self._generate(load, all_up), name=f"bench-load-{calls}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_up.wait(), timeout=ramp_s + _UP_GRACE_S)
            await asyncio.sleep(_SETTLE_S)
            m0, t0, wall0 = await self._metrics(client), time.monotonic(), time.time()
            w0 = self.worker.cpu_s()
            f0 = sum(fake.cpu_s() for fake in self.fakes)
            l0 = self._loadgen_cpu_s()
            s0 = _steal_s(self.steal_core)
            spy = self._sampler(calls)
            scrapes = await self._window(client, c.window_s)
            if spy is not None:
                await asyncio.to_thread(spy.wait, c.window_s + 30)
            m1, t1, wall1 = await self._metrics(client), time.monotonic(), time.time()
            w1 = self.worker.cpu_s()
            f1 = sum(fake.cpu_s() for fake in self.fakes)
            l1 = self._loadgen_cpu_s()
            s1 = _steal_s(self.steal_core)
            result = await task
            await self._wait_idle(client)
        window = t1 - t0
        summary = aggregate(result)
        tick_p99, ticks, tick_mean = _bucket_p99(m0, m1, "gateway_tick_seconds")
        lag_p99, _, lag_mean = _bucket_p99(m0, m1, "gateway_event_loop_lag_seconds")
        overruns = _counter(m0, m1, "gateway_tick_overruns_total")
        in_p99, _, in_mean = _bucket_p99(m0, m1, "gateway_caller_audio_wait_seconds")
        out_p99, _, out_mean = _bucket_p99(m0, m1, "gateway_agent_audio_wait_seconds")
        worker_cpu = (w1 - w0) / window
        up = max((s.up for s in result.timeline), default=0)
        row = {
            "calls": calls,
            "answered": summary["answered"],
            "max_up": up,
            "worker_cpu_pct": 100 * worker_cpu,
            "cpu_pct_per_call": 100 * worker_cpu / calls,
            "cpu_us_per_call_frame": 1e6 * worker_cpu * 0.02 / calls,
            "tick_p99_ms": tick_p99,
            "tick_mean_ms": tick_mean,
            # how late each tick started after its deadline: the worker's own share of the pacing error
            "tick_lag_p99_ms": lag_p99,
            "tick_lag_mean_ms": lag_mean,
            "ticks": ticks,
            "overruns": overruns,
            "scrapes": scrapes,  # GET /metrics made in the window besides the two that bound it (--scrape-every)
            # ticks the worker's clock skipped after stalls longer than its catch-up (every call's audio has a gap)
            "ticks_skipped": _counter(m0, m1, "gateway_ticks_skipped_total"),
            "loss_pct": summary["loss_pct"],
            "lost": summary["packets_lost"],
            "pacing_p99_ms": summary["pacing_error_ms"]["p99"],
            # how long returned packets waited for the generator to read them: its own delay, not counted above
            "gen_read_p99_ms": summary["read_delay_ms"]["p99"],
            "jitter_p99_ms": summary["jitter_ms"]["p99"],
            "rtt_p50_ms": summary["rtt_ms"]["p50"],
            "rtt_p99_ms": summary["rtt_ms"]["p99"],
            "setup_p99_ms": summary["setup_ms"]["p99"],
            # gateway-added delay per direction, from the worker's own histograms (p99: a bucket's upper edge)
            "caller_wait_mean_ms": in_mean,
            "caller_wait_p99_ms": in_p99,
            "agent_wait_mean_ms": out_mean,
            "agent_wait_p99_ms": out_p99,
            # Opus calls the worker moved to being encoded a tick ahead, from the step's start to the window's end
            # (GATEWAY_OPUS_ENCODE_AHEAD_MS), and back
            "opus_ahead": _counter(m_start, m1, "gateway_opus_encode_moves_total", 'to="ahead"'),
            "opus_inline": _counter(m_start, m1, "gateway_opus_encode_moves_total", 'to="inline"'),
            "audio_ok": summary["audio_ok"],
            "audio_checked": summary["audio_checked"],
            "markers": f"{summary['markers_found']}/{summary['markers_expected']}",
            "slips": summary["slips"],
            # why audio slipped, counted by the worker: caller playout underruns and frames it dropped to cut
            # delay, and agent audio that ran out mid-item (all over the window, every call)
            "playout_underruns": _counter(m0, m1, "gateway_playout_events_total", 'event="underrun"'),
            "playout_discarded": _counter(m0, m1, "gateway_playout_events_total", 'event="discarded"'),
            "agent_audio_gaps": _counter(m0, m1, "gateway_agent_audio_gaps_total"),
            # the worker's cyclic-collector passes in the window: middle (generation 1) ones and their mean length,
            # and full ones (a pass of a few ms in a long tick is one way a tick overruns; ADR 0010)
            **_collector_passes(m0, m1),
            "audio_failures": [_audio_failure(call) for call in result.calls if call.audio_ok is False],
            "fake_cpu_pct": 100 * (f1 - f0) / window,
            "loadgen_cpu_pct": 100 * (l1 - l0) / window,
            "loadgen_skipped": summary["generator"]["skipped"],
            # time the hypervisor ran something else on the worker's vCPU while it had work (Linux "steal")
            "steal_pct": 100 * (s1 - s0) / window if s0 is not None and s1 is not None else math.nan,
        }
        if c.gc_census:
            row["gc_census"] = census.read(self.census_path, since=wall0, until=wall1)
        row["sustained"] = bool(
            row["answered"] == calls
            and row["lost"] == 0
            and row["pacing_p99_ms"] <= PACING_LIMIT_MS
            and row["overruns"] == 0
            and row["audio_ok"] == row["audio_checked"]
        )
        return row

    async def _generate(self, load: LoadConfig, all_up: asyncio.Event) -> RunResult:
        """The step's calls, from this process or from ``load_workers`` processes; ``all_up`` is set once every
        call is up."""
        calls = load.calls
        workers = self.config.load_workers
        if workers <= 1:
            runner = LoadRunner(load, progress=lambda p: all_up.set() if p.up >= calls else None)
            return await runner.run()
        loop = asyncio.get_running_loop()

        def progress(latest: list[Progress]) -> None:  # from the thread below, one snapshot per process
            if sum(p.up for p in latest) >= calls:
                loop.call_soon_threadsafe(all_up.set)

        def started(pids: list[int]) -> None:  # from the thread below, before the first progress
            found = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):  # one that died at once: nothing to count or stop
                    found.append(psutil.Process(pid))
            self.load_processes = found

        try:
            return await asyncio.to_thread(
                run_load_processes,
                load,
                workers=workers,
                progress=progress,
                use_uvloop=self.config.uvloop,
                started=started,
            )
        except asyncio.CancelledError:
            # Interrupted: the thread waits on the processes, and the loop cannot close before the thread ends.
            _stop(self.load_processes)
            raise
        finally:
            self.load_processes = []

    def _loadgen_cpu_s(self) -> float:
        """CPU seconds of the load generator so far: this process and this step's load processes."""
        return float(sum(psutil.Process().cpu_times()[:2])) + _cpu_s(self.load_processes)

    async def warm_up(self) -> None:
        """A few short calls first: the worker's first call imports and builds what later calls reuse."""
        load = LoadConfig(
            target=("127.0.0.1", self.sip_port),
            calls=5,
            cps=10.0,
            duration_s=3.0,
            codec=self.config.codec,  # type: ignore[arg-type]
            srtp=self.config.calls_srtp,
            rtp_ports=(self.config.rtp_base, self.config.rtp_base + 199),
            analyze=False,
        )
        await LoadRunner(load).run()
        async with httpx.AsyncClient(timeout=5.0) as client:
            await self._wait_idle(client)

    async def run_steps(self) -> list[dict[str, Any]]:
        await self.warm_up()
        rows: list[dict[str, Any]] = []
        failures = 0
        for calls in self.config.steps:
            runs = []
            for _ in range(self.config.repeats):
                runs.append(await self.step(calls, port_base=self.config.rtp_base))
                print(_row_line(runs[-1]), file=sys.stderr, flush=True)
                for failure in runs[-1]["audio_failures"]:
                    print(f"  audio not right: {failure}", file=sys.stderr, flush=True)
            row = _median_row(runs)
            rows.append(row)
            failures = 0 if row["sustained"] else failures + 1
            if failures >= self.config.stop_after_failures:
                break
        return rows


def _audio_failure(call: CallResult) -> str:
    """Why one call's audio did not come back right, in a line (the report names the call, not just a count)."""
    corr = "-" if call.correlation_min is None else f"{call.correlation_min:.2f}"
    missing = ", ".join(str(j + 1) for j in call.missing_markers)
    return (
        f"call {call.index}: markers {call.markers_found}/{call.markers_expected}"
        + (f" (missing: spurt {missing})" if missing else "")
        + f", min correlation {corr}, slips {call.slips}, lost {call.lost}, jitter {call.jitter_ms or 0:.1f} ms"
    )


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if len(runs) == 1:
        return {**runs[0], "runs": 1, "sustained_runs": int(runs[0]["sustained"])}
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        values = [r[key] for r in runs]
        if isinstance(value, bool):
            out[key] = sum(values) * 2 > len(values)  # a majority of the runs
        elif isinstance(value, list):
            out[key] = [item for v in values for item in v]  # every run's
        elif isinstance(value, int | float):
            finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
            out[key] = statistics.median(finite) if finite else math.nan
        else:
            out[key] = value
    out["runs"] = len(runs)
    out["sustained_runs"] = sum(int(r["sustained"]) for r in runs)
    return out


_COLUMNS = (
    ("calls", "calls", "{:d}"),
    ("worker_cpu_pct", "core %", "{:.0f}"),
    ("cpu_us_per_call_frame", "µs/call/20ms", "{:.0f}"),
    ("tick_p99_ms", "tick p99", "{:.1f}"),
    ("tick_lag_mean_ms", "lag mean", "{:.2f}"),
    ("tick_lag_p99_ms", "lag p99", "{:.0f}"),
    ("overruns", "overruns", "{:.0f}"),
    ("ticks_skipped", "skipped", "{:.0f}"),
    ("loss_pct", "loss %", "{:.3f}"),
    ("pacing_p99_ms", "pacing p99", "{:.1f}"),
    ("gen_read_p99_ms", "gen read p99", "{:.1f}"),
    ("rtt_p50_ms", "rtt p50", "{:.0f}"),
    ("rtt_p99_ms", "rtt p99", "{:.0f}"),
    ("setup_p99_ms", "setup p99", "{:.0f}"),
    ("caller_wait_mean_ms", "in wait", "{:.0f}"),
    ("agent_wait_mean_ms", "out wait", "{:.0f}"),
    ("opus_ahead", "ahead", "{:.0f}"),
    ("opus_inline", "back", "{:.0f}"),
    ("audio_ok", "audio ok", "{}"),
    ("slips", "slips", "{:.0f}"),
    ("playout_underruns", "jb under", "{:.0f}"),
    ("playout_discarded", "jb drop", "{:.0f}"),
    ("agent_audio_gaps", "out gaps", "{:.0f}"),
    ("gc_middle_passes", "gc1", "{:.0f}"),
    ("gc_middle_mean_ms", "gc1 ms", "{:.1f}"),
    ("gc_full_passes", "gc2", "{:.0f}"),
    ("fake_cpu_pct", "fake %", "{:.0f}"),
    ("loadgen_cpu_pct", "gen %", "{:.0f}"),
    ("steal_pct", "steal %", "{:.1f}"),
    ("sustained", "ok", "{}"),
)


def _cell(fmt: str, value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    try:
        return fmt.format(int(value) if fmt == "{:d}" else value)
    except (ValueError, TypeError):
        return str(value)


def _row_line(row: dict[str, Any]) -> str:
    return "  ".join(f"{title} {_cell(fmt, row[key])}" for key, title, fmt in _COLUMNS)


def table(rows: list[dict[str, Any]]) -> str:
    header = [title for _, title, _ in _COLUMNS]
    cells = [[_cell(fmt, row[key]) for key, _, fmt in _COLUMNS] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]]) -> int:
    """The highest step sustained (0 when none was)."""
    return max((int(r["calls"]) for r in rows if r["sustained"]), default=0)


def _run_loop(coro: Any, use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


@dataclass(slots=True)
class _Outcome:
    rows: list[dict[str, Any]]
    pinned: bool
    media_plane: str
    worker_log: str


def _run_bench(config: CallsBenchConfig) -> _Outcome:
    """One worker (and fake) started, every step run ``config.repeats`` times, everything stopped."""
    with tempfile.TemporaryDirectory(prefix="bench-calls-") as work:
        bench = CallsBench(config, directory=Path(work))
        try:
            bench.start()
            rows = _run_loop(bench.run_steps(), config.uvloop)
        finally:
            bench.stop()
            log_tail = bench.worker.log_tail(3000) if bench.worker else ""
    return _Outcome(rows=rows, pinned=bench.pinned, media_plane=bench.media_plane, worker_log=log_tail)


def _variants(config: CallsBenchConfig) -> list[tuple[str, CallsBenchConfig]]:
    if config.srtp is not None:  # the same worker build both times; only the calls' media differs
        return [("plain RTP", replace(config, srtp=None)), ("SRTP", replace(config, srtp=None, calls_srtp=config.srtp))]
    if config.compiled is None:
        return [("source", config)]
    compiled = ("compiled", replace(config, against_source=False))
    if not config.against_source:
        return [compiled]
    return [("source", replace(config, compiled=None, against_source=False)), compiled]


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _measure(config: CallsBenchConfig) -> dict[str, list[_Outcome]]:
    """Every run of every variant (the source and the compiled worker, or one of them)."""
    variants = _variants(config)
    outcomes: dict[str, list[_Outcome]] = {label: [] for label, _ in variants}
    if len(variants) == 1:
        label, only = variants[0]
        outcomes[label].append(_run_bench(only))
        return outcomes
    everything = len(config.steps) + 1
    for _ in range(config.repeats):
        for label, variant in variants:
            print(f"-- {label} worker", file=sys.stderr, flush=True)
            outcomes[label].append(_run_bench(replace(variant, repeats=1, stop_after_failures=everything)))
    return outcomes


def run(config: CallsBenchConfig, *, json_path: str | None = None) -> int:
    """Run the benchmark, print the table and the headline; returns the process exit status.

    With ``compiled`` and ``against_source``, each repeat runs the source worker and then the compiled one, every
    step in both (no early stop), and the tables are followed by the ratio of their CPU per call-frame."""
    logging.basicConfig(level="WARNING")
    load_before = os.getloadavg()
    # SIGTERM stops the run as Ctrl-C does: each worker and fake provider is stopped by the `finally` that
    # started it, not left running without its benchmark.
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        outcomes = _measure(config)
    except KeyboardInterrupt:
        print("gateway bench calls: interrupted; the worker and the fake provider are stopped", file=sys.stderr)
        return 130
    except WorkerExitedError as exc:
        print(f"gateway bench calls: no result, the {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows_of: dict[str, list[dict[str, Any]]] = {}
    for label, runs in outcomes.items():
        if len(runs) == 1:
            rows_of[label] = runs[0].rows
            continue
        by_step: dict[int, list[dict[str, Any]]] = {}
        for outcome in runs:
            for row in outcome.rows:
                by_step.setdefault(int(row["calls"]), []).append(row)
        rows_of[label] = [_median_row(step_runs) for step_runs in by_step.values()]
    load_after = os.getloadavg()
    first = next(iter(outcomes.values()))[0]
    print(
        f"gateway bench calls: engine {config.engine}, codec {config.codec}, provider {config.provider}, "
        + (f"SRTP {config.srtp} against plain RTP, " if config.srtp else "")
        + f"chunk {config.chunk_ms} ms (quiet {config.quiet_chunk_ms} ms), provider format {config.provider_format}, "
        f"window {config.window_s:.0f} s, repeats {config.repeats}, "
        f"worker pinned: {first.pinned}, cpus: {os.cpu_count()}, load cpus: {cpus_named(config.load_core)}, "
        f"fakes {config.fakes}, load workers {config.load_workers}, nice {config.nice}, "
        + (
            f"/metrics scraped every {config.scrape_every_s:g} s (rendered by {config.metrics_render}), "
            if config.scrape_every_s > 0
            else ""
        )
        + f"load average before/after: {load_before[0]:.2f}/{load_after[0]:.2f}"
    )
    best: dict[str, int] = {}
    for label, rows in rows_of.items():
        best[label] = headline(rows)
        print(f"{label} worker ({outcomes[label][0].media_plane}):")
        print(table(rows))
        print(
            f"sustained by one worker core: {best[label]} calls "
            f"(zero loss, pacing p99 <= {PACING_LIMIT_MS:.0f} ms, no overruns)"
        )
        for row in rows:
            if "gc_census" in row:
                print(f"gc census, {row['calls']} calls: {census.summary(row['gc_census'])}")
    ratios = _ratios(rows_of)
    for calls, source_us, compiled_us in ratios:
        print(
            f"{calls} calls: compiled {compiled_us:.0f} against source {source_us:.0f} µs per call-frame "
            f"({compiled_us / source_us:.2f}x; medians of {config.repeats} interleaved runs)"
        )
    srtp_ratios = _ratios(rows_of, base="plain RTP", other="SRTP")
    for calls, plain_us, srtp_us in srtp_ratios:
        print(
            f"{calls} calls: SRTP ({config.srtp}) {srtp_us:.1f} against plain RTP {plain_us:.1f} µs per call-frame "
            f"({srtp_us / plain_us:.3f}x, {srtp_us - plain_us:+.1f} µs; medians of {config.repeats} interleaved runs)"
        )
    if json_path:
        document: dict[str, Any] = {
            "config": {
                "steps": list(config.steps),
                "codec": config.codec,
                "engine": config.engine,
                "provider": config.provider,
                "chunk_ms": config.chunk_ms,
                "quiet_chunk_ms": config.quiet_chunk_ms,
                "provider_format": config.provider_format,
                "window_s": config.window_s,
                "ramp_cps": config.ramp_cps,
                "repeats": config.repeats,
                "pinned": first.pinned,
                "cpus": os.cpu_count(),
                "load_cpus": cpus_named(config.load_core),
                "fakes": config.fakes,
                "load_workers": config.load_workers,
                "nice": config.nice,
                "compiled": config.compiled,
                "srtp": config.srtp,
                "load_average_before_after": [load_before[0], load_after[0]],
            },
            "variants": {
                label: {
                    "media_plane": outcomes[label][0].media_plane,
                    "rows": [_finite(row) for row in rows],
                    "sustained_calls": best[label],
                }
                for label, rows in rows_of.items()
            },
            "ratios": [{"calls": c, "source_us": a, "compiled_us": b} for c, a, b in ratios],
            "srtp_ratios": [{"calls": c, "plain_us": a, "srtp_us": b} for c, a, b in srtp_ratios],
        }
        # The single-variant document keeps its earlier shape (rows and sustained_calls at the top).
        if len(rows_of) == 1:
            label = next(iter(rows_of))
            document["rows"] = document["variants"][label]["rows"]
            document["sustained_calls"] = best[label]
        Path(json_path).write_text(json.dumps(document, indent=2))
    if not any(rows_of.values()):
        print("no step completed; worker log tail:\n" + first.worker_log, file=sys.stderr)
        return 1
    return 0


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _ratios(
    rows_of: dict[str, list[dict[str, Any]]], *, base: str = "source", other: str = "compiled"
) -> list[tuple[int, float, float]]:
    """(calls, ``base`` µs, ``other`` µs) for each step both variants ran."""
    if base not in rows_of or other not in rows_of:
        return []
    compiled = {int(row["calls"]): row["cpu_us_per_call_frame"] for row in rows_of[other]}
    out = []
    for row in rows_of[base]:
        calls = int(row["calls"])
        if calls in compiled and row["cpu_us_per_call_frame"] > 0:
            out.append((calls, float(row["cpu_us_per_call_frame"]), float(compiled[calls])))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", help="comma-separated concurrency steps (default 50,100,200,300,400,600,800)")
    parser.add_argument("--quick", action="store_true", help="smoke run: steps 20,50, a 5 s window")
    parser.add_argument("--codec", choices=["pcmu", "pcma", "g722", "opus"], default="pcmu", help="codec of every call")
    parser.add_argument(
        "--engine", choices=["batched", "percall"], default="batched", help="the worker's media design under test"
    )
    parser.add_argument(
        "--provider", choices=["openai", "echo"], default="openai", help="openai = the fake server over websocket"
    )
    parser.add_argument("--chunk-ms", type=int, default=20, help="caller audio per provider message (20..100)")
    parser.add_argument(
        "--quiet-chunk-ms",
        type=int,
        default=100,
        help="caller audio per provider message once the caller has been quiet for 1 s (= --chunk-ms: off)",
    )
    parser.add_argument(
        "--provider-format",
        choices=["pcm24k", "pcmu"],
        default="pcm24k",
        help="audio format toward the provider; pcmu = G.711 passthrough (the callers' codes as they came)",
    )
    parser.add_argument("--window", type=float, default=20.0, help="measurement window per step, seconds")
    parser.add_argument("--ramp-cps", type=float, default=50.0, help="call rate while a step ramps up")
    parser.add_argument("--repeats", type=int, default=1, help="runs per step (medians are reported)")
    parser.add_argument("--worker-core", type=int, default=0, help="CPU the worker is pinned to (-1: none)")
    parser.add_argument(
        "--load-core",
        type=arguments.cpus,
        default=(1,),
        help="CPU or CPUs for the generator and the fake: 1, 1,2,3 or 2-5 (-1: none)",
    )
    parser.add_argument(
        "--fakes", type=int, default=1, help="fake provider processes sharing one port (a larger host's load side)"
    )
    parser.add_argument(
        "--load-workers", type=int, default=1, help="load generator processes (1: in the bench process itself)"
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="FILE.prof: the worker under cProfile; FILE.perf: perf over each window into FILE.perf-CALLS.data "
        "(sees into a --compiled worker); any other name: py-spy into FILE-CALLS.txt. "
        "Read them with python -m bench._profile",
    )
    parser.add_argument(
        "--gc-census",
        action="store_true",
        help="count what the worker's middle collector passes walk, by kind, and print it per step "
        "(each census stalls the worker ~20 ms at 400 calls: judge overruns in runs without it)",
    )
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="GET the worker's /metrics this often through each window, as a Prometheus server would "
        "(default: only the two scrapes that bound the window)",
    )
    parser.add_argument(
        "--metrics-render",
        choices=["exposition", "generate_latest"],
        default="exposition",
        help="how the worker renders /metrics: in slices, as gateway worker does (default), or in one stretch "
        "with prometheus-client's generate_latest (the comparison)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every row as JSON")
    parser.add_argument("--no-uvloop", action="store_true", help="stdlib asyncio loop in worker, generator and fake")
    parser.add_argument(
        "--compiled", metavar="DIR", help="run the worker on the `gateway compile` build in DIR (GATEWAY_COMPILED)"
    )
    parser.add_argument(
        "--against-source",
        action="store_true",
        help="with --compiled: also run the source worker, interleaved, and report the CPU ratio",
    )
    parser.add_argument(
        "--srtp",
        nargs="?",
        const="AES_CM_128_HMAC_SHA1_80",
        choices=["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"],
        help="also run every step with the calls over SDES SRTP (this suite; default _80), interleaved with plain "
        "RTP, and report the ratio of their CPU per call-frame",
    )
    parser.add_argument("--nice", type=int, default=0, help="niceness of the bench processes (negative: root only)")
    parser.add_argument(
        "--rtp-base",
        type=int,
        default=40000,
        help="first UDP port of the load generator's RTP range (default 40000; move it off another bench's)",
    )


def main(args: argparse.Namespace) -> int:
    steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.steps:
        steps = tuple(int(part) for part in args.steps.split(",") if part.strip())
    config = CallsBenchConfig(
        steps=steps,
        codec=CODECS[args.codec],
        engine=args.engine,
        provider=args.provider,
        chunk_ms=args.chunk_ms,
        quiet_chunk_ms=max(args.quiet_chunk_ms, args.chunk_ms),
        provider_format=args.provider_format,
        window_s=5.0 if args.quick else args.window,
        ramp_cps=args.ramp_cps,
        repeats=args.repeats,
        worker_core=None if args.worker_core < 0 else args.worker_core,
        load_core=args.load_core or None,
        fakes=args.fakes,
        load_workers=args.load_workers,
        profile=args.profile,
        uvloop=not args.no_uvloop,
        nice=args.nice,
        rtp_base=args.rtp_base,
        compiled=args.compiled,
        against_source=args.against_source,
        srtp=args.srtp,
        gc_census=args.gc_census,
        scrape_every_s=args.scrape_every,
        metrics_render=args.metrics_render,
    )
    if args.fakes < 1 or args.load_workers < 1:
        raise SystemExit("gateway bench calls: --fakes and --load-workers must be at least 1")
    if args.scrape_every < 0:
        raise SystemExit("gateway bench calls: --scrape-every must be 0 (off) or a number of seconds")
    if args.fakes > 1 and args.provider != "openai":
        raise SystemExit("gateway bench calls: --fakes runs fake OpenAI servers; it needs --provider openai")
    if args.load_workers > min(steps):
        raise SystemExit(f"gateway bench calls: {args.load_workers} load workers for a step of {min(steps)} calls")
    if args.against_source and not args.compiled:
        raise SystemExit("gateway bench calls: --against-source needs --compiled DIR")
    if args.against_source and args.srtp:
        raise SystemExit("gateway bench calls: --srtp compares against plain RTP; leave out --against-source")
    if args.engine == "percall" and args.compiled:
        # Its engine subclasses TickEngine, and an interpreted class cannot subclass a compiled one.
        raise SystemExit("gateway bench calls: --engine percall runs from source only; leave out --compiled")
    return run(config, json_path=args.json)
