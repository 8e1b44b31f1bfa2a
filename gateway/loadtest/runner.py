"""One load-generator process: SIP glue, RTP sockets, the shared send clock, and the run's bounds.

Shape (the same as the worker's): the SIP core is driven through :class:`~gateway.transport.sip_transport.
SipTransport` (receive -> feed -> drain events -> re-arm one timer); the call flow is :class:`~gateway.loadtest.
calls.LoadCalls`; RTP sockets come from :class:`~gateway.transport.rtp_socket.RtpPortPool`, read with
``add_reader`` callbacks that drain each socket; every call's packets leave from one
:class:`~gateway.transport.clock.MediaClock` tick at absolute 20 ms deadlines (no timer per call).

Calls are placed at ``cps`` on absolute deadlines too (call *i* at ``start + i / cps``), held back while
``calls`` are already up. The run ends when every call has ended, or at the hard deadline
(:attr:`LoadConfig.hard_deadline_s`), whichever comes first; the analysis of what each call received runs
after that, so it never disturbs the pacing of the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.heap import freeze_startup_heap
from gateway.loadtest import _codec
from gateway.loadtest.audio import CallAudio, plan_call_audio, source_audio
from gateway.loadtest.callanalysis import PACING_BINS, analyze_call
from gateway.loadtest.calls import LoadCall, LoadCalls
from gateway.loadtest.config import LoadConfig
from gateway.loadtest.impair import CallImpairment
from gateway.loadtest.media import CallReceiver, CallSender, FrameSchedule
from gateway.loadtest.results import CallResult, GeneratorStats, Progress, RunResult, TimelineSample
from gateway.media.srtp import SrtpConfig, SrtpContext
from gateway.sip.config import SessionTimerConfig, SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.transport.clock import MediaClock
from gateway.transport.ports import free_port
from gateway.transport.rtp_socket import RtpEndpoint, RtpPortPool, RtpPortRange
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import SipTlsConfig, TlsContexts

log = logging.getLogger(__name__)

PLAN_VARIANTS = 16  # distinct send signals; a call cross-wired to another variant fails its audio check
_BYE_GRACE_S = 2.0


@dataclass(slots=True)
class _Media:
    """What the glue hangs off a LoadCall: its socket, stream state and plan."""

    rtp: RtpEndpoint
    receiver: CallReceiver
    variant: int
    sender: CallSender | None = None
    remote: tuple[str, int] | None = None
    send_t0: float | None = None


class LoadRunner:
    """Runs one :class:`LoadConfig` on the running event loop; see the module docstring."""

    def __init__(
        self, config: LoadConfig, *, worker: int = 0, progress: Callable[[Progress], None] | None = None
    ) -> None:
        self.config = config
        self.worker = worker
        self._progress = progress
        self._rng = random.Random(config.seed)
        codec = config.codec
        self._pt = _codec.PAYLOAD_TYPES[codec]
        self._spf = _codec.samples_per_frame(codec)  # PCM samples per 20 ms
        self._ts_step = _codec.timestamp_step(codec)  # RTP timestamp units per 20 ms
        self._silence = _codec.silence_payload(codec)
        self._source = source_audio(config.audio, config.audio_rate, wav=config.wav)
        self._plans: dict[int, tuple[CallAudio, list[bytes], int]] = {}
        self._tick_times: dict[int, float] = {}  # tick -> time.monotonic() when its packets left
        self._sending: dict[int, tuple[CallSender, RtpEndpoint, tuple[str, int], CallImpairment | None]] = {}
        self._impaired: list[CallImpairment] = []
        self._schedule: FrameSchedule | None = None
        self._tick = 0
        self._placed = 0
        self._failed = 0
        self._placed_recent: list[float] = []
        self._slot_free = asyncio.Event()
        self._all_done = asyncio.Event()
        self._timeline: list[TimelineSample] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._stopped_by_deadline = False
        self._interrupted = False
        self._placing_done = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t_start = 0.0

    # ------------------------------------------------------------------------------------- plans

    def _plan(self, variant: int) -> tuple[CallAudio, list[bytes], int]:
        """A send plan, its payloads, and how many samples our own codec delays its first marker."""
        plan = self._plans.get(variant)
        if plan is None:
            rate = self.config.audio_rate
            audio = plan_call_audio(
                self._source,
                rate,
                seconds=self.config.duration_s,
                pattern=self.config.talk,
                offset=variant * rate * 7 // 10,
            )
            payloads = _codec.encode(audio.pcm, self.config.codec)
            plan = (audio, payloads, _own_delay(audio, payloads, self.config.codec))
            self._plans[variant] = plan
        return plan

    # ------------------------------------------------------------------------------------- run

    def stop(self) -> None:
        """End the run now, as its deadline would: no more calls are placed and the calls up are hung up (BYE,
        or CANCEL before the answer), so the target is not left holding them; :meth:`run` returns what ran."""
        self._interrupted = True
        self._all_done.set()

    async def run(self) -> RunResult:
        config = self.config
        loop = asyncio.get_running_loop()
        self._loop = loop
        for v in range(min(PLAN_VARIANTS, config.total_calls)):
            self._plan(v)  # encode before the clock starts: the load must not wait for it
        freeze_startup_heap()  # a full GC pass over the start-up heap would stall every call's RTP at once
        # No collector pass while the calls run, either: in a benchmark running one generator after another in
        # this process, passes of several ticks fell inside the runs (ADR 0006, addendum), each a stalled clock
        # and a burst of RTP on every call. A run is bounded (hard_deadline_s); reference counting frees what it
        # can meanwhile and the cycles are collected once the run is over.
        collecting = gc.isenabled()
        gc.collect()  # what earlier runs in this process left behind: collected now, not during this run
        kind = socket.SOCK_DGRAM if config.transport == "udp" else socket.SOCK_STREAM
        port = free_port(config.local_host, kind=kind)
        self.endpoint = SipEndpoint(
            SipConfig(
                local_host=config.local_host,
                local_port=port,
                tls_port=port,
                transports=(config.transport,),
                user_agent="voice-gateway-loadtest",
                contact_user="load",
                rate_limit=None,
                session_timer=SessionTimerConfig(enabled=False),
                max_calls=max(10, config.calls * 2),
            ),
            # Not config.seed (that makes the audio plans reproducible): Call-IDs, tags and branches must
            # differ from run to run, or a run within 32 s of the last one repeats its (From tag, Call-ID,
            # CSeq) and the target rightly answers 482 Loop Detected (RFC 3261 §8.2.2.2).
        )
        self.calls = LoadCalls(
            self.endpoint,
            target=config.target,
            transport=config.transport,
            codec=config.codec,
            duration_s=config.duration_s,
            setup_timeout_s=config.setup_timeout_s,
            on_answered=self._answered,
            on_ended=self._ended,
            request_user=config.request_user,
            rng=self._rng,
            srtp=config.srtp,
        )
        tls = None
        if config.transport == "tls":
            # Outgoing TLS only (the target answers and sends its BYEs on the connection the calls opened).
            ca = Path(config.tls_ca) if config.tls_ca else None
            tls = TlsContexts(SipTlsConfig(ca_file=ca, verify_server=ca is not None))
        self.sip = SipTransport(
            self.endpoint,
            host=config.local_host,
            port=port,
            transports=(config.transport,),
            on_events=lambda events: self._on_sip_events(events),
            tls=tls,
            tls_port=port,
        )
        first, last = config.rtp_ports
        self.ports = RtpPortPool(RtpPortRange(host=config.local_host, first=first, last=last))
        self.clock = MediaClock(self._on_tick, max_catch_up=3)
        started_wall = time.time()
        self._t_start = time.monotonic()
        await self.sip.start()
        gc.disable()  # enabled again in the finally below
        self.clock.start()
        sampler = asyncio.create_task(self._sample_loop(), name="loadtest-sampler")
        placer = asyncio.create_task(self._place_loop(), name="loadtest-placer")
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout=config.hard_deadline_s)
        except TimeoutError:
            self._stopped_by_deadline = True
            log.warning("load test hit its hard deadline (%.0f s); hanging up", config.hard_deadline_s)
        finally:
            placer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await placer
            self.calls.hang_up_all(time.monotonic(), outcome="interrupted" if self._interrupted else "completed")
            self._pump()
            await self._await_byes()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.clock.stop()
            if self._timer is not None:
                self._timer.cancel()
            await self.sip.aclose()
            if collecting:
                gc.enable()
                gc.collect()
        elapsed = time.monotonic() - self._t_start
        stats = self.clock.stats
        generator = GeneratorStats(
            ticks=stats.ticks,
            overruns=stats.overruns,
            skipped=stats.skipped,
            max_lag_ms=stats.max_lag_s * 1000,
            max_tick_ms=stats.max_duration_s * 1000,
            impair=self.config.impair.describe(),
            impair_dropped=sum(i.dropped for i in self._impaired),
            impair_delayed=sum(i.delayed for i in self._impaired),
        )
        results, hist, read_hist = self._results()
        return RunResult(
            worker=self.worker,
            started_wall=started_wall,
            elapsed_s=elapsed,
            calls=results,
            timeline=self._timeline,
            pacing_hist=hist,
            read_delay_hist=read_hist,
            generator=generator,
            stopped_by_deadline=self._stopped_by_deadline,
            interrupted=self._interrupted,
        )

    async def _await_byes(self) -> None:
        """Let our BYEs get their 200 (bounded): a gateway that never saw the BYE keeps the call open."""
        loop = asyncio.get_running_loop()
        quiet = asyncio.Event()

        def check() -> None:
            # The 200 to a BYE completes a transaction without an event: look, 20 times a second.
            if self.endpoint.call_count == 0:
                quiet.set()
            else:
                handle[0] = loop.call_later(0.05, check)

        handle = [loop.call_soon(check)]
        try:
            await asyncio.wait_for(quiet.wait(), timeout=_BYE_GRACE_S)
        except TimeoutError:
            log.info("%d calls still ending after %.0f s; closing anyway", self.endpoint.call_count, _BYE_GRACE_S)
        finally:
            handle[0].cancel()

    async def _place_loop(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(config.total_calls):
            delay = start + i / config.cps - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            while self.calls.active >= config.calls:
                self._slot_free.clear()
                await self._slot_free.wait()
            self._place(i)
        self._placing_done = True
        self._check_done()

    def _place(self, index: int) -> None:
        rtp = self.ports.allocate()
        receiver = CallReceiver(audio_pt=self._pt, clock_rate=self.config.clock_rate)
        monotonic = time.monotonic  # read times: uvloop's loop.time() has 1 ms steps
        # Arrival = the kernel's receive stamp (on loopback: when the target sent it); the read time beside it.
        rtp.start_stamped(
            lambda data, addr, arrival: receiver.datagram(data, arrival, monotonic()),
            lambda data, addr: receiver.rtcp_datagram(data, 0.0),
        )
        call = self.calls.place(index, rtp_host=rtp.host, rtp_port=rtp.port, now=time.monotonic())
        call.media = _Media(rtp=rtp, receiver=receiver, variant=index % PLAN_VARIANTS)
        self._placed += 1
        self._placed_recent.append(call.invited_at)
        self._pump()

    # ------------------------------------------------------------------------------------- SIP

    def _on_sip_events(self, events: list) -> None:  # type: ignore[type-arg]
        self.calls.on_events(events, time.monotonic())
        self._arm()

    def _pump(self) -> None:
        self.sip.pump()
        self._arm()

    def _arm(self) -> None:
        deadline = self.calls.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._on_timer)  # type: ignore[union-attr]

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.calls.handle_timers(time.monotonic())
        self._pump()

    def _answered(self, call: LoadCall, now: float) -> None:
        media: _Media = call.media  # type: ignore[assignment]
        negotiated = call.negotiated
        assert negotiated is not None
        plan, payloads, _ = self._plan(media.variant)
        te_pt = negotiated.telephone_event_payload_type
        srtp = None
        if call.srtp is not None:  # the same context protects what is sent and opens what is received
            keys = call.srtp
            srtp = SrtpContext(SrtpConfig(suite=keys.suite, local_key=keys.local_key, remote_key=keys.remote_key))
            media.receiver.srtp = srtp
        media.sender = CallSender(
            payloads=payloads,
            silence=self._silence,
            payload_type=negotiated.payload_type,
            samples_per_frame=self._ts_step,
            ssrc=self._rng.getrandbits(32),
            seq0=self._rng.getrandbits(16),
            ts0=self._rng.getrandbits(32),
            start_tick=-1,  # set on the first tick after the answer
            dtmf=self.config.dtmf,
            dtmf_at_frame=plan.first_pause // self._spf + 5,
            telephone_event_pt=te_pt,
            clock_rate=self.config.clock_rate,
            srtp=srtp,
        )
        media.remote = negotiated.remote_rtp
        impairment = None
        if self.config.impair.active:
            impairment = CallImpairment(self.config.impair, self._rng)
            self._impaired.append(impairment)
        self._sending[call.index] = (media.sender, media.rtp, negotiated.remote_rtp, impairment)

    def _ended(self, call: LoadCall, now: float) -> None:
        self._sending.pop(call.index, None)
        media: _Media | None = call.media  # type: ignore[assignment]
        if media is not None:
            self.ports.release(media.rtp)
        if call.answered_at is None:
            self._failed += 1
        self._slot_free.set()
        self._check_done()

    def _check_done(self) -> None:
        if self._placing_done and self.calls.active == 0:
            self._all_done.set()

    # ------------------------------------------------------------------------------------- media

    def _on_tick(self, deadline: float) -> None:
        schedule = self._schedule
        if schedule is None:
            schedule = self._schedule = FrameSchedule(deadline)
        tick = schedule.tick(deadline)
        self._tick_times[tick] = time.monotonic()
        for index, (sender, rtp, remote, impairment) in self._sending.items():
            if sender.start_tick < 0:
                sender.start_tick = tick
            packet = sender.packet(tick)
            if packet is None:
                continue
            if impairment is None:
                rtp.send_rtp(packet, remote)
                continue
            delay = impairment.delay_s(tick - sender.start_tick)
            if delay == 0.0:
                rtp.send_rtp(packet, remote)
            elif delay is not None:
                self._loop.call_later(delay, self._send_held, index, sender, packet)  # type: ignore[union-attr]

    def _send_held(self, index: int, sender: CallSender, packet: bytes) -> None:
        """A packet the impairment held back leaves now, unless its call has ended meanwhile."""
        entry = self._sending.get(index)
        if entry is not None and entry[0] is sender:
            entry[1].send_rtp(packet, entry[2])

    async def _sample_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + 1.0
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at += 1.0
            self._sample(time.monotonic())

    def _sample(self, now: float) -> None:
        expected = lost = 0
        jitters: list[float] = []
        up = 0
        for call in self.calls.calls.values():
            if call.phase != "up":
                continue
            up += 1
            stats = call.media.receiver.stats  # type: ignore[attr-defined]
            expected += stats.received_total + stats.cumulative_lost
            lost += stats.cumulative_lost
            jitters.append(stats.jitter_ms)
        self._placed_recent = [t for t in self._placed_recent if t > now - 1.0]
        sample = TimelineSample(
            t_s=now - self._t_start,
            up=up,
            placed=self._placed,
            failed=self._failed,
            loss_pct=100.0 * lost / expected if expected else 0.0,
            jitter_p99_ms=float(np.percentile(jitters, 99)) if jitters else 0.0,
        )
        self._timeline.append(sample)
        if self._progress is not None:
            self._progress(
                Progress(
                    worker=self.worker,
                    elapsed_s=sample.t_s,
                    up=up,
                    placed=self._placed,
                    failed=self._failed,
                    cps=float(len(self._placed_recent)),
                    loss_pct=sample.loss_pct,
                    jitter_p99_ms=sample.jitter_p99_ms,
                )
            )

    # ------------------------------------------------------------------------------------- results

    def _results(self) -> tuple[list[CallResult], np.ndarray, np.ndarray]:
        """Every finished call's result, the pacing-error histogram and the generator's read-delay histogram."""
        hist = np.zeros(PACING_BINS, dtype=np.int64)
        read_hist = np.zeros(PACING_BINS, dtype=np.int64)
        out: list[CallResult] = []
        schedule = self._schedule
        for call in sorted(self.calls.finished, key=lambda c: c.index):
            media: _Media = call.media  # type: ignore[assignment]
            out.append(self._result(call, media, schedule, hist, read_hist))
        return out, hist, read_hist

    def _result(
        self, call: LoadCall, media: _Media, schedule: FrameSchedule | None, hist: np.ndarray, read_hist: np.ndarray
    ) -> CallResult:
        t0 = self._t_start
        base = dict(
            index=call.index,
            worker=self.worker,
            placed_s=call.invited_at - t0,
            outcome=call.outcome,
            status=call.status,
            reason=call.reason,
        )
        if call.answered_at is None or media.sender is None:
            return CallResult(**base)  # type: ignore[arg-type]
        sender = media.sender
        stats = media.receiver.stats
        plan, _, own_delay = self._plan(media.variant)
        send_t0 = None
        analysis = None
        if schedule is not None and sender.start_tick >= 0:
            start, times = sender.start_tick, self._tick_times
            deadline = schedule.deadline

            def frame_sent(k: int) -> float:
                return times.get(start + k) or deadline(start + k)

            send_t0 = frame_sent(0)
            analysis = analyze_call(
                plan,
                media.receiver,
                codec=self.config.codec,
                frame_sent=frame_sent,
                codec_delay=own_delay,
                check_audio=self.config.analyze,
                frames_sent=sender.sent if call.outcome == "interrupted" else None,
            )
            hist += analysis.pacing_hist
            if analysis.read_delay_hist is not None:
                read_hist += analysis.read_delay_hist
        correlations = analysis.correlations if analysis is not None else ()
        return CallResult(
            **base,  # type: ignore[arg-type]
            setup_ms=(call.answered_at - call.invited_at) * 1000,
            answered_s=call.answered_at - t0,
            ended_s=(call.ended_at - t0) if call.ended_at is not None else None,
            packets_sent=sender.sent,
            packets_received=stats.received_total,
            expected=stats.received_total + stats.cumulative_lost,
            lost=stats.cumulative_lost,
            duplicates=stats.duplicates,
            sequence_errors=stats.out_of_range + stats.restarts,
            jitter_ms=stats.jitter_ms if stats.received_total > 1 else None,
            rtt_ms=analysis.rtt_ms if analysis else (),
            rtt_at_s=tuple(send_t0 + t - t0 for t in analysis.rtt_at) if analysis and send_t0 else (),
            markers_expected=analysis.markers_expected if analysis else 0,
            markers_found=analysis.markers_found if analysis else 0,
            missing_markers=analysis.missing if analysis else (),
            correlation_min=min(correlations) if correlations else None,
            audio_ok=analysis.audio_ok if analysis else False,
            pacing_p99_ms=analysis.pacing_p99_ms if analysis else None,
            barge_in_stop_ms=analysis.barge_in_stop_ms if analysis else (),
            dtmf_sent=sender.dtmf_sent,
            slips=analysis.slips if analysis else 0,
        )


async def run_load(
    config: LoadConfig,
    *,
    worker: int = 0,
    progress: Callable[[Progress], None] | None = None,
    stop_on_signals: bool = False,
) -> RunResult:
    """One load run. ``stop_on_signals``: SIGTERM, and SIGINT unless this process ignores it (a background job),
    stop the run early (:meth:`LoadRunner.stop`) instead of killing the process with its calls still up."""
    runner = LoadRunner(config, worker=worker, progress=progress)
    if not stop_on_signals:
        return await runner.run()
    loop = asyncio.get_running_loop()
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signals.append(signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, runner.stop)
    try:
        return await runner.run()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def _own_delay(plan: CallAudio, payloads: list[bytes], codec: str) -> int:
    """Samples between a marker in the plan and in our own decoded payloads (Opus look-ahead, G.722's QMFs; 0 for
    G.711)."""
    if codec not in ("opus", "G722") or not plan.markers:
        return 0
    from gateway.loadtest.analysis import chirp, find_marker
    from gateway.loadtest.audio import MARKER_MS

    first = plan.markers[0]
    n = _codec.samples_per_frame(codec)  # type: ignore[arg-type]
    k = first // n
    decoded = _codec.decode(payloads[k : k + 10], codec)  # type: ignore[arg-type]
    match = find_marker(decoded, chirp(plan.rate, ms=MARKER_MS))
    return 0 if match is None else match.offset - (first - k * n)
