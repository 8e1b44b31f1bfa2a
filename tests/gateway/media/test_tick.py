"""The batched media tick: G.711/Opus in and out, batching equivalence, add/remove, PLC, DTMF, RTCP, latching."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.media.call import MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.jitter import JitterConfig
from gateway.media.rfc4733 import parse_telephone_event
from gateway.media.rtcp import parse_rtcp
from gateway.media.rtp import build_rtp, parse_rtp
from gateway.media.tick import TickEngine
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.opus import SILENCE_SETTLE_FRAMES, OpusEncoder

PEER = ("192.0.2.10", 4000)


def config(call_id: str = "c1", codec: str = "PCMU", **overrides: object) -> MediaCallConfig:
    pt = {"PCMU": 0, "PCMA": 8, "opus": 111, "G722": 9}[codec]
    fields: dict[str, object] = {
        "call_id": call_id,
        "codec": codec,
        "payload_type": pt,
        "telephone_event_pt": 101,
        "remote_rtp": PEER,
        "ssrc": 1000 + sum(call_id.encode()),
        "initial_sequence": 65500,
        "initial_timestamp": 2**32 - 1600,
    }
    fields.update(overrides)
    return MediaCallConfig(**fields)  # type: ignore[arg-type]


def tone(freq: float, rate: int, seconds: float, amp: float = 8000.0, phase: float = 0.0) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t + phase)).astype(np.int16)


def best_correlation(a: npt.NDArray[np.int16], b: npt.NDArray[np.int16], max_lag: int) -> float:
    """Normalised correlation of b against a at the lag (0..max_lag, b lagging a) where they match best."""
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    size = len(x) + len(y)
    cross = np.fft.irfft(np.fft.rfft(y, size) * np.conj(np.fft.rfft(x, size)), size)  # cross[k] = sum y[t+k] x[t]
    lag = int(np.argmax(cross[: max_lag + 1]))
    n = min(len(x), len(y) - lag)
    xs, ys = x[:n], y[lag : lag + n]
    denom = float(np.sqrt(np.dot(xs, xs) * np.dot(ys, ys)))
    return float(np.dot(xs, ys)) / denom if denom else 0.0


def feed_g711(engine: TickEngine, call_id: str, signal8: npt.NDArray[np.int16], *, law: str = "PCMU") -> list[Frame]:
    """Send signal8 as 20 ms packets, one per tick, and collect the inbound frames."""
    encode = ulaw_encode if law == "PCMU" else alaw_encode
    frames = []
    ticks = len(signal8) // 160
    for k in range(ticks + 6):
        now = k * 0.02
        if k < ticks:
            payload = encode(signal8[k * 160 : (k + 1) * 160])
            data = build_rtp(
                payload_type=0 if law == "PCMU" else 8,
                sequence_number=(60000 + k) & 0xFFFF,
                timestamp=(2**32 - 320 + k * 160) & 0xFFFFFFFF,
                ssrc=77,
                payload=payload,
            )
            assert engine.packet_received(call_id, data, PEER, now) is None
        frames.append(engine.tick_inbound(now + 0.001).frames[call_id])
    return frames


@pytest.mark.parametrize("law", ["PCMU", "PCMA"])
def test_g711_inbound_frames_correlate_with_the_source(law: str) -> None:
    engine = TickEngine()
    engine.add_call(config(codec=law), now=0.0)
    signal8 = tone(440, 8000, 0.5) + tone(1300, 8000, 0.5, amp=3000)
    frames = feed_g711(engine, "c1", signal8, law=law)
    assert [f.index for f in frames] == list(range(len(frames)))
    assert all(f.pcm.shape == (FRAME_SAMPLES,) for f in frames)
    out = np.concatenate([f.pcm for f in frames])
    reference = tone(440, 24000, 0.5) + tone(1300, 24000, 0.5, amp=3000)
    assert best_correlation(reference, out, 24000 // 10) > 0.98
    stats = engine.stats("c1", 1.0)
    assert stats.received == 25 and stats.lost == 0 and stats.late == 0


def test_outbound_rtp_sequence_timestamps_marker_and_content() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    signal24 = tone(500, 24000, 0.4)
    packets = []
    for k in range(20):
        frame = Frame(index=k, pcm=signal24[k * 480 : (k + 1) * 480])
        out = engine.tick_outbound({"c1": frame}, k * 0.02)
        assert len(out) == 1 and out[0][0] == "c1" and out[0][1] == PEER
        packets.append(parse_rtp(out[0][2]))
    assert [p.sequence_number for p in packets] == [(65500 + k) & 0xFFFF for k in range(20)]
    assert [p.timestamp for p in packets] == [(2**32 - 1600 + 160 * k) & 0xFFFFFFFF for k in range(20)]
    assert [p.marker for p in packets] == [True] + [False] * 19
    assert {len(p.payload) for p in packets} == {160}
    decoded = np.concatenate([ulaw_decode(p.payload) for p in packets])
    assert best_correlation(tone(500, 8000, 0.4), decoded, 800) > 0.98


def test_silence_is_still_sent_when_no_frame() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    engine.add_call(config("c2", "PCMA"), now=0.0)
    first = engine.tick_outbound({}, 0.0)
    second = engine.tick_outbound({"c1": None}, 0.02)
    assert sorted(c for c, _, _ in first) == ["c1", "c2"] and len(second) == 2
    for _, _, data in first + second:
        p = parse_rtp(data)
        pcm = ulaw_decode(p.payload) if p.payload_type == 0 else alaw_decode(p.payload)
        assert np.abs(pcm.astype(np.int32)).max() <= 8
    stamps = {c: parse_rtp(d).timestamp for c, _, d in second}
    assert stamps["c1"] == stamps["c2"] == (2**32 - 1600 + 160) & 0xFFFFFFFF


CODECS = {"a": "PCMU", "b": "PCMA", "c": "PCMU", "d": "PCMA", "e": "PCMU"}


def _run(engine: TickEngine, active: list[str], ticks: int) -> tuple[dict, dict]:
    """Drive the calls in ``active`` with the same pseudo-random audio every run (drawn for all of CODECS)."""
    rng = np.random.default_rng(7)
    signals = {cid: (rng.standard_normal(160 * ticks) * 3000).astype(np.int16) for cid in CODECS}
    outbound = {cid: (rng.standard_normal(480 * ticks) * 3000).astype(np.int16) for cid in CODECS}
    frames: dict[str, list[npt.NDArray[np.int16]]] = {cid: [] for cid in active}
    packets: dict[str, list[bytes]] = {cid: [] for cid in active}
    for k in range(ticks):
        for cid in active:
            law = CODECS[cid]
            encode = ulaw_encode if law == "PCMU" else alaw_encode
            payload = encode(signals[cid][k * 160 : (k + 1) * 160])
            data = build_rtp(
                payload_type=0 if law == "PCMU" else 8, sequence_number=k, timestamp=k * 160, ssrc=5, payload=payload
            )
            if k % 7 != 3:  # some loss, so concealed rows are part of the batch too
                engine.packet_received(cid, data, PEER, k * 0.02)
        tick = engine.tick_inbound(k * 0.02 + 0.001)
        for cid in active:
            frames[cid].append(tick.frames[cid].pcm.copy())
        # Every fifth tick has no outbound frame (silence) for everyone.
        mapping = {cid: Frame(index=k, pcm=outbound[cid][k * 480 : (k + 1) * 480]) for cid in active if k % 5}
        for cid, _, data in engine.tick_outbound(mapping, k * 0.02):
            if cid in packets:
                packets[cid].append(data)
    return frames, packets


def test_batched_output_equals_per_call_processing() -> None:
    ids = list(CODECS)
    batched = TickEngine()
    for cid in ids:
        batched.add_call(config(cid, CODECS[cid]), now=0.0)
    frames, packets = _run(batched, ids, 30)
    for cid in ids:
        single = TickEngine()
        single.add_call(config(cid, CODECS[cid]), now=0.0)
        solo_frames, solo_packets = _run(single, [cid], 30)
        assert all(np.array_equal(x, y) for x, y in zip(frames[cid], solo_frames[cid], strict=True))
        assert packets[cid] == solo_packets[cid]
        assert sum(int(np.abs(f).sum() > 0) for f in frames[cid]) > 20
    assert batched.stats("a", 1.0).concealed >= 3


def test_add_and_remove_calls_between_ticks() -> None:
    engine = TickEngine()
    for cid in ("a", "b", "c"):
        engine.add_call(config(cid, CODECS[cid]), now=0.0)
    tick = engine.tick_inbound(0.0)
    assert sorted(tick.frames) == ["a", "b", "c"]
    bye = engine.remove_call("b")
    assert len(bye) == 1 and bye[0][:2] == ("b", ("192.0.2.10", 4001))
    assert [type(p).__name__ for p in parse_rtcp(bye[0][2])] == ["ReceiverReport", "Bye"]
    assert engine.remove_call("b") == []
    tick = engine.tick_inbound(0.02)
    assert sorted(tick.frames) == ["a", "c"] and tick.frames["a"].index == 1
    assert sorted(c for c, _, _ in engine.tick_outbound({}, 0.02)) == ["a", "c"]
    # A call added later reuses the freed DSP rows, with fresh state: it behaves like a call alone.
    engine.add_call(config("d", "PCMA"), now=0.04)
    assert engine.tick_inbound(0.04).frames["d"].index == 0
    with pytest.raises(LocalMediaError):
        engine.add_call(config("d", "PCMA"), now=0.04)
    fresh = TickEngine()
    fresh.add_call(config("d", "PCMA"), now=0.0)
    mine, my_packets = _run(engine, ["d"], 10)
    theirs, their_packets = _run(fresh, ["d"], 10)
    # Zero state fed one silent frame is still zero state: the reused rows carry nothing over from "b".
    assert all(np.array_equal(x, y) for x, y in zip(mine["d"], theirs["d"], strict=True))
    assert my_packets == their_packets
    with pytest.raises(LocalMediaError):
        engine.stats("b", 0.0)


def test_plc_repeats_and_fades_then_silence() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    signal8 = tone(300, 8000, 0.2, amp=10000)
    frames = []
    for k in range(18):
        if k < 6:
            data = build_rtp(
                payload_type=0,
                sequence_number=k,
                timestamp=k * 160,
                ssrc=9,
                payload=ulaw_encode(signal8[k * 160 : (k + 1) * 160]),
            )
            engine.packet_received("c1", data, PEER, k * 0.02)
        frames.append(engine.tick_inbound(k * 0.02 + 0.001).frames["c1"].pcm)
    levels = [float(np.sqrt(np.mean(f.astype(np.float64) ** 2))) for f in frames]
    # Tick 0 prefills (20 ms < 40 ms), ticks 1-6 play frames 0-5, then the stream stops: ticks 7-9 repeat the
    # last frame under a fade, and from tick 10 on it is silence (up to the resampler's tail).
    assert levels[0] == 0.0
    assert all(lv > 5000 for lv in levels[2:7])
    assert levels[6] > levels[7] > levels[8] > levels[9] > 0
    assert 0.6 < levels[7] / levels[6] < 0.95
    assert max(levels[11:]) == 0.0
    # The jitter buffer counts the gap's frames concealed while the next packet might still come on time (10
    # frames: a loss); the 11th without one makes the gap an underrun (the sender stopped).
    stats = engine.stats("c1", 1.0)
    assert stats.concealed == 10 and stats.underruns == 1 and stats.lost == 0


@pytest.mark.parametrize("law", ["PCMU", "PCMA"])
def test_g711_frames_carry_the_callers_own_codes_and_the_codes_of_concealment(law: str) -> None:
    engine = TickEngine()
    engine.add_call(config(codec=law), now=0.0)
    encode, decode = (ulaw_encode, ulaw_decode) if law == "PCMU" else (alaw_encode, alaw_decode)
    signal8 = tone(300, 8000, 0.2, amp=10000)
    sent = [encode(signal8[k * 160 : (k + 1) * 160]) for k in range(6)]
    frames = []
    for k in range(14):
        if k < 6:
            data = build_rtp(
                payload_type=0 if law == "PCMU" else 8, sequence_number=k, timestamp=k * 160, ssrc=9, payload=sent[k]
            )
            engine.packet_received("c1", data, PEER, k * 0.02)
        frames.append(engine.tick_inbound(k * 0.02 + 0.001).frames["c1"])
    assert {f.g711_law for f in frames} == {law.lower()}
    # Ticks 1-6 play the packets: their codes are the caller's bytes, unchanged.
    assert [f.g711 for f in frames[1:7]] == sent
    # Ticks 7-9 conceal: the codes are the faded repeat of the last frame, so they fall in level too.
    levels = [float(np.sqrt(np.mean(decode(f.g711 or b"").astype(np.float64) ** 2))) for f in frames]
    assert levels[6] > levels[7] > levels[8] > levels[9] > 0
    # Before the first packet and after the fade, silence codes.
    silence = bytes([0xFF if law == "PCMU" else 0xD5]) * 160
    assert frames[0].g711 == silence and frames[13].g711 == silence


def test_dtmf_received_events_come_out_of_the_inbound_tick() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)

    def send(seq: int, ts: int, payload: bytes, marker: bool = False) -> None:
        data = build_rtp(payload_type=101, sequence_number=seq, timestamp=ts, ssrc=3, payload=payload, marker=marker)
        assert engine.packet_received("c1", data, PEER, 0.0) is None

    seq = 0
    for press_ts, digit in ((800, 1), (4000, 1), (8000, 11)):
        for k in range(3):
            send(seq, press_ts, bytes([digit, 10]) + (160 * (k + 1)).to_bytes(2, "big"), marker=k == 0)
            seq += 1
        for _ in range(3):  # the end packet and its two retransmissions
            send(seq, press_ts, bytes([digit, 0x80 | 10]) + (640).to_bytes(2, "big"))
            seq += 1
    events = engine.tick_inbound(0.02).events
    assert [(e.call_id, e.digit, e.rtp_timestamp) for e in events] == [
        ("c1", "1", 800),
        ("c1", "1", 4000),
        ("c1", "#", 8000),
    ]
    assert engine.tick_inbound(0.04).events == []
    assert engine.stats("c1", 0.1).dtmf_received == 3


def test_dtmf_send_packet_sequence_through_the_engine() -> None:
    engine = TickEngine()
    engine.add_call(config(initial_sequence=0, initial_timestamp=0), now=0.0)
    engine.tick_outbound({}, 0.0)
    engine.send_dtmf("c1", "9", duration_ms=60)
    packets = [parse_rtp(engine.tick_outbound({}, 0.02 * (k + 1))[0][2]) for k in range(8)]
    events = [(p.payload_type, p.marker, p.timestamp, parse_telephone_event(p.payload)) for p in packets[:5]]
    assert events == [
        (101, True, 160, (9, False, 10, 160)),
        (101, False, 160, (9, False, 10, 320)),
        (101, False, 160, (9, True, 10, 480)),
        (101, False, 160, (9, True, 10, 480)),
        (101, False, 160, (9, True, 10, 480)),
    ]
    assert packets[5].payload_type == 0 and packets[5].timestamp == 6 * 160
    assert [p.sequence_number for p in packets] == list(range(1, 9))
    with pytest.raises(LocalMediaError):
        engine.send_dtmf("c1", "Z")
    with pytest.raises(LocalMediaError):
        engine.send_dtmf("nope", "1")


def test_latching_malformed_and_unknown_calls_are_counted() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    good = build_rtp(payload_type=0, sequence_number=1, timestamp=0, ssrc=1, payload=b"\xff" * 160)
    assert engine.packet_received("c1", good, ("203.0.113.5", 4000), 0.0) == "foreign_source"
    assert engine.packet_received("c1", b"\x80\x00", PEER, 0.0) == "malformed_short"
    assert engine.packet_received("c1", b"\x00" * 20, PEER, 0.0) == "malformed_version"
    assert engine.packet_received("zz", good, PEER, 0.0) == "unknown_call"
    assert engine.packet_received("c1", good, ("192.0.2.10", 40000), 0.1) is None
    out = engine.tick_outbound({}, 0.12)
    assert out[0][1] == ("192.0.2.10", 40000)  # latched to the NAT-mapped port
    assert engine.dropped == {"foreign_source": 1, "malformed_short": 1, "malformed_version": 1, "unknown_call": 1}
    stats = engine.stats("c1", 0.2)
    assert stats.malformed == 2 and stats.foreign_source == 1 and stats.latched
    assert engine.inactive_for("c1", 0.6) == pytest.approx(0.5)


def test_rtcp_between_two_engines_reports_rtt_and_loss() -> None:
    alice, bob = TickEngine(wall_clock_offset=1.7e9), TickEngine(wall_clock_offset=1.7e9 + 123.0)
    alice.add_call(config("x", remote_rtp=("10.0.0.2", 5000), ssrc=1), now=0.0)
    bob.add_call(config("x", remote_rtp=("10.0.0.1", 6000), ssrc=2), now=0.0)
    for k in range(50):
        for _, _, data in alice.tick_outbound({}, k * 0.02):
            if k != 10:
                bob.packet_received("x", data, ("10.0.0.1", 6000), k * 0.02 + 0.03)
    assert alice.rtcp_due(0.5) == []
    due = alice.rtcp_due(5.0)
    assert len(due) == 1 and due[0][1] == ("10.0.0.2", 5001)
    assert alice.rtcp_due(5.0) == []  # rescheduled 2.5..7.5 s later
    assert bob.rtcp_received("x", due[0][2], ("10.0.0.1", 6001), 5.04) is None
    reply = bob.rtcp_due(7.5)
    assert len(reply) == 1
    assert alice.rtcp_received("x", reply[0][2], ("10.0.0.2", 5001), 5.0 + 0.08 + (7.5 - 5.04)) is None
    stats = alice.stats("x", 8.0)
    assert stats.rtt_ms == pytest.approx(80.0, abs=0.1)  # 2.54 s elapsed minus 2.46 s held by bob
    assert stats.remote_cumulative_lost == 1 and stats.remote_fraction_lost == pytest.approx(5 / 256)


def test_rtcp_mux_packets_on_the_rtp_port_are_routed_to_rtcp() -> None:
    engine = TickEngine()
    engine.add_call(config(rtcp_mux=True), now=0.0)
    assert engine.call("c1").rtcp_address == PEER
    other = TickEngine()
    other.add_call(config(ssrc=77, remote_rtp=("192.0.2.1", 1)), now=0.0)
    other.tick_outbound({}, 0.0)
    _, _, sr = other.rtcp_due(10.0)[0]
    assert engine.packet_received("c1", sr, PEER, 0.0) is None
    assert engine.stats("c1", 0.0).received == 0  # RTCP is not counted as RTP


def test_opus_call_round_trip_between_two_engines() -> None:
    alice, bob = TickEngine(), TickEngine()
    alice.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    bob.add_call(config("o", "opus", remote_rtp=("10.0.0.1", 6000)), now=0.0)
    signal24 = tone(440, 24000, 0.6, amp=6000)
    received = []
    for k in range(30 + 8):
        now = k * 0.02
        frame = Frame(index=k, pcm=signal24[k * 480 : (k + 1) * 480]) if k < 30 else None
        for _, _, data in alice.tick_outbound({"o": frame}, now):
            assert bob.packet_received("o", data, ("10.0.0.1", 6000), now + 0.005) is None
        received.append(bob.tick_inbound(now + 0.01).frames["o"].pcm)
    out = np.concatenate(received)
    assert best_correlation(signal24, out, 24000 // 5) > 0.9
    assert bob.stats("o", 1.0).received == 38


def test_an_opus_callers_silent_agent_costs_no_libopus_encode_once_settled() -> None:
    """The tick's silent rows reach the encoder as exact zeros, so it reuses its settled silence packet."""
    engine = TickEngine()
    engine.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    speech = tone(300, 24000, 0.2, amp=6000)
    packets = []
    for k in range(40):
        frame = Frame(index=k, pcm=speech[k * 480 : (k + 1) * 480]) if k < 10 else None
        packets += [data for _, _, data in engine.tick_outbound({"o": frame}, k * 0.02)]
    assert len(packets) == 40  # a packet every 20 ms, silence included
    encoder = engine._opus["o"].encoder
    # No resampler sits between the tick and the encoder (libopus takes 24 kHz): the first silent frame is exact
    # zeros, and only the settling frames of the 30 silent ones reach libopus.
    assert encoder.reused == 30 - SILENCE_SETTLE_FRAMES
    payloads = [parse_rtp(data).payload for data in packets[10 + SILENCE_SETTLE_FRAMES - 1 :]]
    assert len(set(payloads)) == 1


def test_opus_loss_is_concealed_and_garbage_is_counted() -> None:
    engine = TickEngine()
    sender = TickEngine()
    sender.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    engine.add_call(config("o", "opus"), now=0.0)
    signal24 = tone(300, 24000, 0.4, amp=6000)
    levels = []
    for k in range(20):
        frame = Frame(index=k, pcm=signal24[k * 480 : (k + 1) * 480])
        for _, _, data in sender.tick_outbound({"o": frame}, k * 0.02):
            if k not in (8, 9):
                engine.packet_received("o", data, PEER, k * 0.02)
        levels.append(engine.tick_inbound(k * 0.02 + 0.01).frames["o"].level_dbfs)
    stats = engine.stats("o", 1.0)
    assert stats.concealed == 2 and stats.lost == 2
    assert min(levels[10:]) > -40  # audio went on through the concealed frames
    # A packet whose TOC says 20 ms but which libopus rejects (over-long): counted, concealed, no exception.
    for k, payload in enumerate([b"\xfc" + b"\xff" * 1500, b"\xfc" + b"\xff" * 1500]):
        bogus = build_rtp(payload_type=111, sequence_number=0xABC0 + k, timestamp=k * 960, ssrc=0xABC, payload=payload)
        engine.packet_received("o", bogus, PEER, 0.5 + 0.02 * k)
    frames = [engine.tick_inbound(0.52 + 0.02 * k).frames["o"] for k in range(4)]
    assert [f.index for f in frames] == [20, 21, 22, 23]
    assert engine.stats("o", 1.0).dropped["malformed_opus"] == 2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=60), max_size=8), st.sampled_from(["PCMU", "opus", "G722"]))
def test_no_datagram_makes_the_engine_raise(datagrams: list[bytes], codec: str) -> None:
    engine = TickEngine()
    engine.add_call(config(codec=codec, rtcp_mux=True), now=0.0)
    for k, data in enumerate(datagrams):
        # Valid-looking headers with arbitrary payloads too, so the payload paths see garbage.
        rtp = build_rtp(
            payload_type=engine.call("c1").config.payload_type,
            sequence_number=k,
            timestamp=k * 960,
            ssrc=1,
            payload=data,
        )
        for datagram in (data, rtp, bytes([0x80, 101]) + data):
            engine.packet_received("c1", datagram, PEER, k * 0.02)
            engine.rtcp_received("c1", datagram, PEER, k * 0.02)
        engine.tick_inbound(k * 0.02 + 0.01)
    assert engine.tick_outbound({}, 1.0)[0][0] == "c1"


def test_one_packet_per_second_is_followed_to_the_frame_that_plays_it() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    payloads = [bytes([k % 120 + 1]) * 160 for k in range(80)]
    seen: list[tuple[int, float, bytes | None]] = []
    for k in range(80):
        if k != 50:  # the packet due at 1.0 s is lost: the next one is probed instead
            data = build_rtp(payload_type=0, sequence_number=k, timestamp=k * 160, ssrc=9, payload=payloads[k])
            engine.packet_received("c1", data, PEER, k * 0.02)
        tick = engine.tick_inbound(k * 0.02 + 0.001)
        for call_id, arrived in tick.probes.items():
            assert call_id == "c1"
            seen.append((k, arrived, tick.frames[call_id].g711))
    # Packet 0 (arrived at 0.0) plays at tick 1 (40 ms start delay); packet 51 (1.02 s) at tick 52.
    assert [(k, round(arrived, 3)) for k, arrived, _ in seen] == [(1, 0.0), (52, 1.02)]
    assert [codes for _, _, codes in seen] == [payloads[0], payloads[51]]  # the frame carries that packet


def test_an_opus_callers_excess_delay_is_given_back_in_a_pause_the_tick_heard() -> None:
    alice, bob = TickEngine(), TickEngine()
    alice.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    policy = JitterConfig(warmup_packets=0, shrink_window_frames=10, shrink_hold_frames=0, shrink_pause_frames=5)
    bob.add_call(config("o", "opus", remote_rtp=("10.0.0.1", 6000), jitter=policy), now=0.0)
    talk = tone(300, 24000, 0.8, amp=8000)  # 40 frames of sound, then silence
    packets = []
    for k in range(100):
        frame = Frame(index=k, pcm=talk[k * 480 : (k + 1) * 480] if k < 40 else np.zeros(480, np.int16))
        packets += [data for _, _, data in alice.tick_outbound({"o": frame}, k * 0.02)]
    for data in packets[:8]:  # a burst: 160 ms arrive at once, far above the buffer's 20 ms target
        bob.packet_received("o", data, ("10.0.0.1", 6000), 0.0)
    first_drop = None
    for k, data in enumerate(packets[8:]):
        bob.packet_received("o", data, ("10.0.0.1", 6000), k * 0.02)
        bob.tick_inbound(k * 0.02 + 0.01)
        if first_drop is None and bob.stats("o", k * 0.02).discarded:
            first_drop = k
    # due within the first window, but the frames dropped come from the pause: tick k plays media frame ~k
    assert first_drop is not None and first_drop >= 40


def _talk_and_pause(pattern: list[tuple[bool, int]]) -> list[Frame | None]:
    """Outbound frames: a tone for each talking stretch, None (silence) for each pause, in ticks."""
    frames: list[Frame | None] = []
    for talking, ticks in pattern:
        for _ in range(ticks):
            k = len(frames)
            pcm = tone(300 + 10 * k, 24000, 0.02, amp=6000)
            frames.append(Frame(index=k, pcm=pcm) if talking else None)
    return frames


def test_opus_encoded_ahead_moves_a_tick_later_in_a_pause_and_back_in_the_next() -> None:
    """Asked for in mid-speech, the change waits for the pause's settled silence: going ahead repeats that
    packet once, coming back leaves one out. Every payload is the encoder's own, in order, and the RTP stream
    has no gap: the caller's jitter buffer sees one tick of delay come and go inside pauses, nothing else."""
    engine = TickEngine()
    engine.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    frames = _talk_and_pause([(True, 10), (False, 10), (True, 10), (False, 15), (True, 10)])
    reference = OpusEncoder(sample_rate=24000)
    expected = [reference.encode(f.pcm if f is not None else np.zeros(480, np.int16)) for f in frames]
    sent, ahead = [], []
    for k, frame in enumerate(frames):
        if k == 2:
            engine.opus_ahead = True  # asked for while the agent talks
        if k == 25:
            engine.opus_ahead = False
        sent += [parse_rtp(data) for _, _, data in engine.tick_outbound({"o": frame}, k * 0.02)]
        engine.encode_ahead()
        ahead.append(engine.opus_calls_ahead)
    went, back = ahead.index(1), ahead.index(0, ahead.index(1))
    # Ahead from the first tick after the pause settled (3 silent frames fed to the encoder, then its reused
    # packet), back at the same point of the next pause, where the pending frame is that packet.
    assert went == 10 + SILENCE_SETTLE_FRAMES + 1
    assert back == 30 + SILENCE_SETTLE_FRAMES + 1
    quiet = expected[went - 1]
    assert expected[went - 2] == quiet and expected[back - 2] == expected[back - 1]  # settled silence, both
    assert [p.payload for p in sent] == [*expected[:went], quiet, *expected[went : back - 1], *expected[back:]]
    # One packet a tick, numbered and timed as one stream.
    assert len(sent) == len(frames)
    assert [(p.sequence_number - sent[0].sequence_number) % 65536 for p in sent] == list(range(len(sent)))
    assert [(p.timestamp - sent[0].timestamp) % 2**32 for p in sent] == [960 * k for k in range(len(sent))]
    # The talk spurt that began while ahead is marked on the packet that carries it, a tick after its frame.
    assert [k for k, p in enumerate(sent) if p.marker] == [0, 21, 45]


def test_opus_frames_queued_ahead_are_sent_even_when_encode_ahead_was_skipped() -> None:
    engine = TickEngine()
    engine.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    engine.opus_ahead = True
    frames = _talk_and_pause([(False, SILENCE_SETTLE_FRAMES + 2), (True, 3)])
    payloads = []
    for k, frame in enumerate(frames):
        payloads += [parse_rtp(data).payload for _, _, data in engine.tick_outbound({"o": frame}, k * 0.02)]
        if k != len(frames) - 2:  # a tick that ended before its encodes (an exception in the worker's tick)
            engine.encode_ahead()
    reference = OpusEncoder(sample_rate=24000)
    expected = [reference.encode(f.pcm if f is not None else np.zeros(480, np.int16)) for f in frames]
    went = SILENCE_SETTLE_FRAMES + 1
    assert engine.opus_calls_ahead == 1
    assert payloads == [*expected[:went], expected[went - 1], *expected[went:-1]]  # nothing lost or repeated


def test_an_opus_call_comes_back_inline_only_by_leaving_out_silence_the_agent_did_not_send() -> None:
    """The session counts every frame it hands out as heard (barge-in truncation): a pending frame of the agent's
    own digital silence is sent, and the call comes back inline at a pause with no agent audio."""
    engine = TickEngine()
    engine.add_call(config("o", "opus", remote_rtp=("10.0.0.2", 5000)), now=0.0)
    engine.opus_ahead = True
    zeros = np.zeros(480, np.int16)
    frames: list[Frame | None] = [None] * 6 + [Frame(index=k, pcm=zeros) for k in range(6, 16)] + [None] * 6
    ahead, sent = [], 0
    assert engine.opus_moves == {"ahead": 0, "inline": 0}
    for k, frame in enumerate(frames):
        if k == 8:
            engine.opus_ahead = False  # inside the agent's digital silence, the encoder long settled
        sent += len(engine.tick_outbound({"o": frame}, k * 0.02))
        engine.encode_ahead()
        ahead.append(engine.opus_calls_ahead)
    assert ahead.index(1) == SILENCE_SETTLE_FRAMES + 1
    assert ahead.index(0, ahead.index(1)) == 17  # the first tick whose pending frame was no agent audio
    assert engine.opus_moves == {"ahead": 1, "inline": 1}
    assert sent == len(frames)
