"""The media worker end to end in one event loop: a scripted SIP phone (our own UA core) calls a worker
running the echo agent; SIP, RTP, the tick, the session and the provider all run for real on loopback."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.fleet.errors import CallNotFoundError
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.sip.events import CallEnded, OutboundCallAnswered, OutboundCallFailed
from gateway.transport.rtp_socket import RtpDrain
from gateway.worker.settings import WorkerSettings
from gateway.worker.sip_leg import CallLeg
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import SipPeer, echo_worker
from tests.support.audio import align_and_correlate
from tests.support.loop_turns import LoopTurns
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)


def speechlike(seconds: float, rate: int = 8000, seed: int = 3) -> np.ndarray:
    """Noise shaped by a syllable-rate envelope: broadband, non-periodic, easy to correlate."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 3.1 * t) * np.sin(2 * np.pi * 0.7 * t)
    from scipy import signal

    # telephone band: what a G.711 round trip through 24 kHz passes untouched
    sos = signal.butter(8, [200, 3000], btype="bandpass", fs=rate, output="sos")
    noise = signal.sosfilt(sos, rng.standard_normal(n))
    return (noise / np.abs(noise).max() * 12000 * envelope).astype(np.int16)


def best_correlation(sent: np.ndarray, heard: np.ndarray) -> float:
    correlation, _ = align_and_correlate(sent, heard, 8000)
    return correlation


@pytest.fixture
async def worker(request: pytest.FixtureRequest) -> AsyncIterator[MediaWorker]:
    overrides = getattr(request, "param", {})  # e.g. RTP read by the tick (ADR 0007) instead of per packet
    async with echo_worker(worker_id="w-test", rtp_timeout_s=1.0, **overrides) as w:
        yield w


async def _until(predicate, *, within: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def _answered(peer: SipPeer, call) -> None:  # type: ignore[no-untyped-def]
    event = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, event.body)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "worker", [{"rtp_read_at_tick": True}, {}], indirect=True, ids=["read-at-tick", "read-per-packet"]
)
@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
async def test_a_call_echoes_the_callers_audio_and_releases_everything(worker: MediaWorker, codec: str) -> None:
    drain = worker.rtp_drain
    assert (drain is not None) == (worker.settings.media.rtp_read_at_tick and RtpDrain.supported())
    tasks_before = {t for t in asyncio.all_tasks() if not t.done()}
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=(codec,))
        await _answered(peer, call)
        assert call.codec == codec
        sent = speechlike(2.0)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)  # let the echo drain
        [leg] = list(worker.legs.values())
        snapshot = worker.snapshot_of(leg)
        assert snapshot.codec == codec and snapshot.state == "active"
        assert snapshot.stats.rtp_packets_in >= 100 and snapshot.stats.rtp_lost == 0
        # a clean loopback stream: the jitter buffer ran dry at most where the caller stopped sending, dropped
        # nothing, and the echo never left a gap
        assert snapshot.stats.underruns <= 1 and snapshot.stats.discarded == 0
        assert snapshot.stats.agent_audio_gaps == 0
        if drain is not None:
            assert len(drain) == 1  # the call's RTP socket, read by the tick
        _assert_routed(worker, leg)
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert leg.end_reason == "caller_hangup"
        correlation = best_correlation(sent, peer.heard(call))
        assert correlation > 0.9, correlation
    assert worker.legs == {}
    assert worker.routes == {}
    assert worker.ports.in_use == frozenset()
    assert len(worker.engine) == 0
    assert drain is None or len(drain) == 0
    leftover = {t for t in asyncio.all_tasks() if not t.done()} - tasks_before - {asyncio.current_task()}
    assert not [t for t in leftover if t.get_name().startswith(("call-", "worker-"))]


def _assert_routed(worker: MediaWorker, leg: CallLeg) -> None:
    """The tick reaches the call through its route: the leg's own session and RTP sockets."""
    [(call_id, route)] = worker.routes.items()
    assert call_id == leg.id and route.leg is leg
    assert route.session is leg.session and route.session is not None
    assert route.rtp is leg.rtp and route.rtp is not None


@pytest.mark.parametrize(
    "worker",
    [{"opus_encode_ahead_ms": 0.0}, {"opus_encode_ahead_ms": 20.0}],
    indirect=True,
    ids=["encoded-ahead", "encoded-inline"],
)
async def test_an_opus_call_echoes_right_whether_encoded_ahead_or_inline(worker: MediaWorker) -> None:
    """GATEWAY_OPUS_ENCODE_AHEAD_MS: 0 encodes every Opus call a tick ahead (from its first pause on), 20 never;
    the caller hears its speech back either way, one packet a tick, none lost."""
    ahead = worker.settings.media.opus_encode_ahead_ms == 0
    labels = {"worker": worker.settings.worker_id, "to": "ahead"}
    moved_before = _sample("gateway_opus_encode_moves_total", **labels)
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("opus",))
        await _answered(peer, call)
        assert call.codec == "opus"
        if ahead:  # the call moves in the agent's first pause: the echo agent's silence before the caller talks
            await _until(lambda: worker.engine.opus_calls_ahead == 1, within=2.0)
        sent = speechlike(2.0)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)  # let the echo drain
        [leg] = list(worker.legs.values())
        assert worker.engine.opus_calls_ahead == int(ahead)
        worker.export_counters()
        assert _sample("gateway_opus_calls_encoded_ahead", worker=worker.settings.worker_id) == int(ahead)
        assert _sample("gateway_opus_encode_moves_total", **labels) - moved_before == int(ahead)
        snapshot = worker.snapshot_of(leg)
        assert snapshot.stats.rtp_lost == 0 and snapshot.stats.agent_audio_gaps == 0
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        seqs = call.received_seqs
        assert [(b - a) % 65536 for a, b in itertools.pairwise(seqs)] == [1] * (len(seqs) - 1)  # no gap, no repeat
        correlation = best_correlation(sent, peer.heard(call))
        assert correlation > 0.6, correlation  # two Opus passes keep about 0.77 of noise-like speech


async def test_rtp_keeps_flowing_while_the_agent_is_silent(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
        await _answered(peer, call)
        await peer.stream(call, np.zeros(8000, np.int16), frames=25)
        # one packet per 20 ms, silence included
        assert len(call.received) >= 20
        assert all(p == bytes([0xFF]) * 160 for p in call.received[3:15])
        peer.hang_up(call)


async def _calls_talking(worker: MediaWorker, *, calls: int, seconds: float) -> list[CallLeg]:
    """Answer ``calls`` calls, stream ``seconds`` of speech on each at once, hang up; the legs they had."""
    async with SipPeer() as peer:
        placed = [peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}") for _ in range(calls)]
        for call in placed:
            await _answered(peer, call)
        await asyncio.gather(*(peer.stream(call, speechlike(seconds)) for call in placed))
        legs = list(worker.legs.values())
        for call in placed:
            peer.hang_up(call)
    return legs


async def test_a_tick_sends_every_callers_packet_before_its_inbound_half(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each call's packet leaves at the same point of every tick, not after however long the inbound half took.
    import inspect

    from gateway.session.session import CallSession
    from gateway.transport.rtp_socket import RtpEndpoint

    if not inspect.isfunction(RtpEndpoint.send_rtp):
        pytest.skip("the probe patches Python methods; the compiled build runs the same tick, checked from source")

    log: list[tuple[int, str]] = []
    send_rtp, push_inbound = RtpEndpoint.send_rtp, CallSession.push_inbound

    def sent(self: RtpEndpoint, data: bytes, addr: tuple[str, int]) -> None:
        log.append((worker._tick_no, "send"))
        send_rtp(self, data, addr)

    def pushed(self: CallSession, frame, **kwargs) -> None:  # type: ignore[no-untyped-def]
        log.append((worker._tick_no, "push"))
        push_inbound(self, frame, **kwargs)

    monkeypatch.setattr(RtpEndpoint, "send_rtp", sent)
    monkeypatch.setattr(CallSession, "push_inbound", pushed)
    await _calls_talking(worker, calls=3, seconds=0.4)
    ticks: dict[int, list[str]] = {}
    for tick, what in log:
        ticks.setdefault(tick, []).append(what)
    full = [order for order in ticks.values() if order.count("send") == 3 and order.count("push") == 3]
    assert len(full) >= 10, ticks
    assert all(order == ["send"] * 3 + ["push"] * 3 for order in full), full


async def test_calls_take_turns_to_have_their_level_sampled(
    worker: MediaWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each call's level (the dashboard's sparkline) is sampled once per LEVEL_EVERY_TICKS, on a tick of its own:
    # sampling every call on one tick made that tick 8 ms longer at 200 calls, and it overran.
    import collections
    import inspect

    import gateway.worker.worker as worker_module

    if not inspect.isfunction(MediaWorker._on_tick):
        pytest.skip("the probe patches a Python global; the compiled build runs the same tick, checked from source")
    sampled: list[int] = []
    level = worker_module.dbfs

    def probe(pcm: np.ndarray) -> float:  # type: ignore[type-arg]
        sampled.append(worker._tick_no)
        return level(pcm)

    monkeypatch.setattr(worker_module, "dbfs", probe)
    legs = await _calls_talking(worker, calls=3, seconds=1.2)
    assert len({leg.level_phase for leg in legs}) == 3
    assert len(sampled) >= 6
    assert max(collections.Counter(sampled).values()) == 1, sampled  # never two calls on one tick
    assert all(leg.levels and max(leg.levels) > -50 for leg in legs)


async def test_a_stall_past_the_clocks_catch_up_leaves_a_timestamp_gap_not_a_lasting_delay(
    worker: MediaWorker,
) -> None:
    # The media clock runs five late ticks back, then skips the rest of a stall. The ticks it skipped move every
    # call's RTP clock on (a gap in the timestamps, sequence numbers contiguous), so the phone plays what
    # follows on time; before, every later packet of every call carried the stall as extra delay.
    import time

    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
        await _answered(peer, call)
        streaming = asyncio.create_task(peer.stream(call, speechlike(3.0)))
        try:
            await _until(lambda: len(call.received) >= 10)
            skipped_before = worker.clock.stats.skipped
            metric_before = _sample("gateway_ticks_skipped_total", worker=worker.settings.worker_id)
            count = len(call.received)
            stall_until = time.monotonic() + 0.3  # the event loop stalled for 15 periods: more than five catch-ups
            while time.monotonic() < stall_until:
                pass
            await _until(lambda: len(call.received) >= count + 25)
        finally:
            streaming.cancel()
        skipped = worker.clock.stats.skipped - skipped_before
        assert skipped >= 5, "the stall did not make the clock skip ticks"
        assert _sample("gateway_ticks_skipped_total", worker=worker.settings.worker_id) - metric_before == skipped
        seqs = [s for s, pt in zip(call.received_seqs, call.received_pts) if pt == call.payload_type]
        stamps = [t for t, pt in zip(call.received_timestamps, call.received_pts) if pt == call.payload_type]
        assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(seqs)), "a packet was lost or reordered"
        steps = [(b - a) % 2**32 for a, b in itertools.pairwise(stamps)]
        assert sum(step - 160 for step in steps) == skipped * 160
        assert {step for step in steps if step != 160} <= {160 * (1 + n) for n in range(1, skipped + 1)}


async def test_no_common_codec_gets_488(worker: MediaWorker) -> None:
    body = (
        b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        b"m=audio 40000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n"
    )
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", body=body)
        failed = await peer.wait_for(OutboundCallFailed, call=call.handle)
        assert failed.status == 488  # type: ignore[attr-defined]
    assert worker.ports.in_use == frozenset()


async def test_a_worker_admits_calls_by_what_their_codec_costs(worker: MediaWorker) -> None:
    # capacity 8 G.711 calls; an Opus call takes opus_call_cost = 8 of them: the whole worker.
    assert (worker.settings.costs.capacity, worker.settings.costs.opus_call_cost) == (8, 8.0)
    target = f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}"
    async with SipPeer() as peer:
        opus = peer.invite(target, codecs=("opus",))
        await _answered(peer, opus)
        assert opus.codec == "opus"
        [leg] = list(worker.legs.values())
        assert worker.snapshot_of(leg).cost == 8.0
        assert (worker.info().active_calls, worker.info().used, worker.info().load) == (1, 8.0, 1.0)
        worker.export_counters()
        labels = {"worker": worker.settings.worker_id}
        assert (_sample("gateway_capacity", **labels), _sample("gateway_capacity_used", **labels)) == (8.0, 8.0)
        refused = peer.invite(target, codecs=("PCMU",))
        failed = await peer.wait_for(OutboundCallFailed, call=refused.handle)
        assert failed.status == 503  # type: ignore[attr-defined]
        peer.hang_up(opus)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        g711 = [peer.invite(target, codecs=("PCMU", "opus")) for _ in range(2)]  # G.711 first: it is chosen
        for call in g711:
            await _answered(peer, call)
            assert call.codec == "PCMU"
        assert (worker.info().active_calls, worker.info().used) == (2, 2.0)
        worker.export_counters()
        assert _sample("gateway_capacity_used", **labels) == 2.0
        for call in g711:
            peer.hang_up(call)
        await _until(lambda: not worker.legs)


async def test_a_draining_worker_refuses_new_calls_with_503(worker: MediaWorker) -> None:
    await worker.drain(exit_when_empty=False)
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
        failed = await peer.wait_for(OutboundCallFailed, call=call.handle)
        assert failed.status == 503  # type: ignore[attr-defined]


async def test_a_silent_caller_is_hung_up_after_the_rtp_timeout(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
        await _answered(peer, call)
        await peer.stream(call, speechlike(0.2), frames=5)
        ended = await peer.wait_for(CallEnded, call=call.handle, within=5)
        assert ended.by == "remote"  # type: ignore[attr-defined]
        await _until(lambda: not worker.legs)
    assert worker.ports.in_use == frozenset()


async def test_ops_commands_reach_the_call(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
        await _answered(peer, call)
        [leg_id] = list(worker.legs)
        await worker.send_dtmf(leg_id, "12")
        await peer.stream(call, np.zeros(8000, np.int16), frames=20)
        telephone_events = [pt for pt in call.received_pts if pt == 101]
        assert telephone_events, "RFC 4733 DTMF packets were sent to the caller"
        await worker.hang_up(leg_id, "api")
        ended = await peer.wait_for(CallEnded, call=call.handle)
        assert ended.by == "remote"  # type: ignore[attr-defined]
        await _until(lambda: not worker.legs)
    with pytest.raises(CallNotFoundError):
        await worker.hang_up(leg_id, "api")


async def test_an_originated_call_to_a_number_goes_through_the_trunk_with_digest_auth() -> None:
    from gateway.fleet.errors import CommandRejectedError
    from gateway.fleet.models import AdmissionDecision, OriginateRequest
    from gateway.sip.auth import DigestAuthenticator
    from gateway.sip.digest import DigestChallenger
    from gateway.sip.events import CallOffered

    challenger = DigestChallenger(realm="trunk", credentials={"gw": "s3cret"}.get, nonce_secret=b"k" * 32)
    async with SipPeer(authenticator=DigestAuthenticator(challenger)) as trunk:
        sip_port = free_ports(1)[0]
        rtp_low = free_ports(20)[0]
        rtp_low += rtp_low % 2
        settings = WorkerSettings(
            worker_id="w-out",
            sip_port=sip_port,
            rtp_ports=f"{rtp_low}-{rtp_low + 17}",
            trunk=f"127.0.0.1:{trunk.port}",
            trunk_user="gw",
            trunk_password="s3cret",
        )
        worker = MediaWorker(settings, model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)))
        await worker.start()
        try:
            admission = AdmissionDecision(accepted=True, call_id="c-out", worker="w-out", route="default")
            call_id = await worker.originate(OriginateRequest(to="+15550123", caller_id="+15550199"), admission)
            offered = await trunk.wait_for(CallOffered)
            assert offered.request_uri.startswith("sip:+15550123@127.0.0.1")  # type: ignore[attr-defined]
            assert any(n.lower() == "authorization" for n, _ in offered.headers)  # type: ignore[attr-defined]
            call = trunk.answer(offered)  # type: ignore[arg-type]
            sent = speechlike(1.5)
            await trunk.stream(call, sent)
            await trunk.stream(call, np.zeros(8000, np.int16), frames=15)
            assert best_correlation(sent, trunk.heard(call)) > 0.9
            _assert_routed(worker, worker.legs[call_id])
            await worker.hang_up(call_id, "api")
            await trunk.wait_for(CallEnded, call=call.handle)
            await _until(lambda: not worker.legs)
            assert worker.routes == {}
            with pytest.raises(CommandRejectedError):
                unconfigured = MediaWorker(
                    WorkerSettings(worker_id="w-none", sip_port=free_ports(1)[0]),
                    model_factory=lambda name: EchoModel(),
                )
                await unconfigured.originate(OriginateRequest(to="+15550123"), admission)
        finally:
            await worker.aclose()


def _sample(name: str, **labels: str) -> float:
    from gateway.observability import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_drops_of_the_sip_and_media_cores_reach_the_metrics(worker: MediaWorker) -> None:
    import socket

    w = worker.settings.worker_id
    malformed_before = _sample("gateway_rtp_dropped_total", worker=w, reason="malformed_version")
    sip_before = _sample("gateway_sip_rejected_total", worker=w, reason="malformed_answered")
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
        await _answered(peer, call)
        assert call.remote_rtp is not None
        for _ in range(5):  # RTP version 1: counted and dropped
            call.rtp.sendto(b"\x40" + bytes(171), call.remote_rtp)
        junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        junk.sendto(
            b"INVITE sip:x SIP/9.9\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKq\r\n\r\n",
            ("127.0.0.1", worker.settings.sip.sip_port),
        )
        junk.close()
        await peer.stream(call, speechlike(0.4))
        worker.export_counters()
        assert _sample("gateway_rtp_dropped_total", worker=w, reason="malformed_version") == malformed_before + 5
        assert _sample("gateway_sip_rejected_total", worker=w, reason="malformed_answered") >= sip_before + 1
        assert _sample("gateway_rtp_packets_total", worker=w, direction="in") >= 20
        peer.hang_up(call)


async def test_a_worker_started_before_its_control_plane_registers_when_it_comes_up() -> None:
    import socket

    import uvicorn

    from gateway.control.app import create_app
    from gateway.control.settings import ControlSettings
    from gateway.fleet.http import HttpControlLink, RetryPolicy

    control_port = free_ports(1)[0]
    link = HttpControlLink(f"http://127.0.0.1:{control_port}", None, policy=RetryPolicy(attempts=1, timeout_s=1.0))
    settings = WorkerSettings(worker_id="w-early", sip_port=free_ports(1)[0], rtp_ports="45000-45099")
    worker = MediaWorker(settings, model_factory=lambda name: EchoModel(), link=link, heartbeat_s=0.1)
    await worker.start()  # nothing listens on control_port yet: start() must not fail
    app = create_app(ControlSettings(http_port=control_port))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", control_port))

    class Quiet(uvicorn.Server):
        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

        def capture_signals(self):  # type: ignore[no-untyped-def]
            import contextlib

            return contextlib.nullcontext()

    server = Quiet(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        plane = app.state.plane
        await _until_async(lambda: _registered(plane, "w-early"), within=10)
    finally:
        await worker.aclose()
        await link.aclose()
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        sock.close()


async def _registered(plane, worker_id: str) -> bool:  # type: ignore[no-untyped-def]
    return any(w.id == worker_id for w in await plane.list_workers())


async def _until_async(predicate, *, within: float) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_started_worker_has_frozen_its_start_up_heap(worker: MediaWorker) -> None:
    # A full collection must not walk the modules and libraries loaded at start-up (docs/adr/0006-gc-freeze.md).
    import gc

    assert gc.get_freeze_count() > 10_000


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


async def test_an_idle_worker_runs_the_due_full_collection_after_a_tick_not_cpython(worker: MediaWorker) -> None:
    # docs/adr/0010-full-collections-paced-by-the-tick.md: CPython never starts a full pass while the worker runs;
    # the worker runs it after a tick, at once with no call live. Each pass is timed into the metrics.
    import gc
    import weakref

    assert worker.collector is not None and gc.get_threshold()[2] > 1_000_000
    assert gc.get_threshold()[1] == worker.settings.gc.gc_middle_after == 2  # shorter middle passes, more often

    def paced_in_metrics() -> float:
        return _sample("gateway_gc_pause_seconds_count", generation="2", trigger="tick")

    passes_before, metric_before = worker.collector.full_passes, paced_in_metrics()
    with worker.collector.held():
        old = _Cyclic()
        gc.collect(1)  # alive: on to the oldest generation, which only a full pass examines
        probe = weakref.ref(old)
        del old
        for _ in range(worker.collector.policy.full_after + 1):
            gc.collect(1)  # what CPython counts before a full pass is due
        assert probe() is not None
    await _until(lambda: probe() is None, within=2.0)
    assert worker.collector.full_passes > passes_before
    assert paced_in_metrics() > metric_before


async def test_a_worker_with_pacing_off_leaves_the_automatic_collector_alone() -> None:
    import gc

    sip_port = free_ports(1)[0]
    rtp_low = free_ports(4)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(
        worker_id="w-gc-auto", sip_port=sip_port, rtp_ports=f"{rtp_low}-{rtp_low + 3}", capacity=2, gc_paced=False
    )
    w = MediaWorker(settings, model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)))
    await w.start()
    try:
        assert w.collector is None and gc.get_threshold()[2] < 1_000
    finally:
        await w.aclose()


async def _assert_freed_by_reference_counting(worker: MediaWorker) -> None:
    # A call that leaves reference cycles behind is freed only by a full GC pass, which walks the whole heap
    # and stalls every call's tick and every new call's setup (docs/adr/0006-gc-freeze.md).
    # Counted among the objects the collector tracks, not by weak reference: the compiled build's classes
    # (gateway.compiled) take none. With collection off, an object left in a cycle stays on that list.
    import gc

    def alive(kinds: tuple[type, ...]) -> int:
        return sum(1 for obj in gc.get_objects() if type(obj) in kinds)

    gc.collect()
    gc.disable()
    assert worker.collector is not None
    try:
        # No paced pass either (docs/adr/0010-collector-paced-by-the-tick.md): reference counting alone.
        with worker.collector.held():
            async with SipPeer() as peer:
                call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
                await _answered(peer, call)
                await peer.stream(call, speechlike(0.5))
                [leg] = list(worker.legs.values())
                assert leg.session is not None
                kinds = (type(leg), type(leg.session))
                assert alive(kinds) == 2
                peer.hang_up(call)
                await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
                del leg
                await _until(lambda: alive(kinds) == 0, within=2.0)
    finally:
        gc.enable()


async def test_an_ended_call_is_freed_by_reference_counting_alone(worker: MediaWorker) -> None:
    await _assert_freed_by_reference_counting(worker)


async def test_an_ended_call_over_the_openai_adapter_is_freed_by_reference_counting_alone() -> None:
    from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
    from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel

    sip_port = free_ports(1)[0]
    rtp_low = free_ports(4)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(worker_id="w-gc", sip_port=sip_port, rtp_ports=f"{rtp_low}-{rtp_low + 3}", capacity=2)
    async with FakeRealtimeServer(FakeOptions()) as fake:
        config = OpenAIConfig(url=fake.url, api_key="test-key", setup_timeout_s=5.0)
        w = MediaWorker(settings, model_factory=lambda name: OpenAIRealtimeModel(config))
        await w.start()
        try:
            await _assert_freed_by_reference_counting(w)
        finally:
            await w.aclose()


async def test_gateway_added_delays_and_the_reply_round_trip_reach_the_metrics() -> None:
    # Against the fake OpenAI server (server VAD: the turn ends after 500 ms of silence, the reply is the turn).
    from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
    from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel

    sip_port = free_ports(1)[0]
    rtp_low = free_ports(4)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(worker_id="w-lat", sip_port=sip_port, rtp_ports=f"{rtp_low}-{rtp_low + 3}", capacity=2)
    names = (
        "gateway_caller_audio_wait_seconds",
        "gateway_agent_audio_wait_seconds",
        "gateway_provider_latency_seconds",
    )
    labels = [{"worker": "w-lat"}, {"worker": "w-lat", "provider": "openai"}, {"worker": "w-lat", "provider": "openai"}]
    before = [(_sample(f"{n}_count", **lb), _sample(f"{n}_sum", **lb)) for n, lb in zip(names, labels, strict=True)]
    async with FakeRealtimeServer(FakeOptions()) as fake:
        config = OpenAIConfig(url=fake.url, api_key="test-key", setup_timeout_s=5.0)
        w = MediaWorker(settings, model_factory=lambda name: OpenAIRealtimeModel(config))
        await w.start()
        try:
            async with SipPeer() as peer:
                call = peer.invite(f"sip:agent@127.0.0.1:{sip_port}", codecs=("PCMU",))
                await _answered(peer, call)
                await peer.stream(call, speechlike(1.5))
                await peer.stream(call, np.zeros(8000, np.int16), frames=75)  # the turn ends; the reply plays
                peer.hang_up(call)
        finally:
            await w.aclose()
    after = [(_sample(f"{n}_count", **lb), _sample(f"{n}_sum", **lb)) for n, lb in zip(names, labels, strict=True)]
    (n_in, s_in), (n_out, s_out), (n_rt, s_rt) = (
        (a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)
    )
    assert n_in >= 2  # one probed packet per second of caller audio
    assert 0.0 < s_in / n_in < 0.1  # jitter buffer start delay + up to a tick: tens of ms, not hundreds
    assert n_out >= 1 and 0.0 <= s_out / n_out < 0.1  # the reply's first frame leaves within a few ticks
    # the provider's VAD said the caller stopped -> the reply's first frame; the fake replies at that moment
    assert n_rt == 1 and 0.0 < s_rt < 0.1


@pytest.mark.parametrize("worker", [{"jitter_min_delay_ms": 100}], indirect=True)
async def test_the_workers_jitter_settings_reach_every_callers_buffer(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
        await _answered(peer, call)
        await peer.stream(call, speechlike(0.4))
        [leg] = list(worker.legs.values())
        # a clean stream's jitter asks for 30 ms at most: the configured floor is what the buffer holds
        assert worker.engine.stats(leg.id, worker.clock_now()).target_delay_ms == 100
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]


async def test_the_workers_sessions_take_the_quiet_chunk_settings() -> None:
    settings = WorkerSettings(
        worker_id="w-q", provider_chunk_ms=40, provider_quiet_chunk_ms=160, provider_quiet_after_ms=600
    )
    config = MediaWorker(settings, model_factory=lambda name: EchoModel()).session_config
    assert (config.inbound_chunk_ms, config.inbound_quiet_chunk_ms, config.inbound_quiet_after_ms) == (40, 160, 600)
    assert config.quiet_chunk_frames == 8


async def test_walks_of_every_call_let_the_loop_in_between_calls(worker: MediaWorker) -> None:
    """The heartbeat's snapshots and the counters' export walk every call off the tick: with a zero slice the
    loop runs between any two calls (at the default, every half millisecond), and nothing is left out."""
    target = f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}"
    async with SipPeer() as peer:
        calls = [peer.invite(target, codecs=("PCMU",)) for _ in range(3)]
        for call in calls:
            await _answered(peer, call)
        await _until(lambda: sum(leg.media_added for leg in worker.legs.values()) == 3)
        worker.slice_s = 0.0
        turns = LoopTurns()
        await asyncio.sleep(0)
        before = turns.turns
        snapshots = await worker.snapshot()
        assert sorted(s.id for s in snapshots) == sorted(worker.legs) and turns.turns - before >= 3
        before = turns.turns
        await worker.export_counters_in_slices()
        assert turns.turns - before >= 3
        turns.running = False
        for call in calls:
            peer.hang_up(call)
        await _until(lambda: not worker.legs)
