"""G.722 calls through the media tick: speech both ways, the 8000 RTP clock, wideband content, batching, loss
concealment with the decoder's state kept, a restarted stream, DTMF and SRTP beside PT 9, and malformed payloads
counted and dropped."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from gateway.media.call import MediaCallConfig
from gateway.media.rfc4733 import parse_telephone_event
from gateway.media.rtcp import SenderReport, parse_rtcp
from gateway.media.rtp import build_rtp, parse_rtp
from gateway.media.srtp import SrtpConfig, SrtpContext
from gateway.media.tick import TickEngine
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g722 import G722Decoder, G722Encoder
from tests.gateway.media.test_tick import best_correlation, tone
from tests.gateway.media.test_tick import config as tick_config
from tests.support.audio import read_wav, speech_wav
from tests.support.fixtures import SPEECH, require_speech_tools

PEER = ("192.0.2.10", 4000)


def config(call_id: str = "g", **overrides: object) -> MediaCallConfig:
    # A timestamp three G.722 frames (160 ticks each at its RTP clock of 8000) before it wraps.
    fields: dict[str, object] = {
        "codec": "G722",
        "ssrc": 4000 + sum(call_id.encode()),
        "initial_sequence": 65530,
        "initial_timestamp": 2**32 - 480,
    }
    fields.update(overrides)
    return tick_config(call_id, **fields)  # type: ignore[arg-type]


def packets_from(
    signal16: npt.NDArray[np.int16], *, ssrc: int = 9, first_seq: int = 100, first_ts: int = 0
) -> list[bytes]:
    """What a G.722 phone sends: 20 ms packets of 160 octets, timestamps 160 apart (the 8000 clock)."""
    encoder = G722Encoder()
    out = []
    for k in range(signal16.shape[0] // 320):
        payload = encoder.encode(np.ascontiguousarray(signal16[k * 320 : (k + 1) * 320]))
        out.append(
            build_rtp(
                payload_type=9,
                sequence_number=(first_seq + k) & 0xFFFF,
                timestamp=first_ts + 160 * k,
                ssrc=ssrc,
                payload=payload,
            )
        )
    return out


def play(engine: TickEngine, datagrams: list[bytes | None], *, call_id: str = "g", extra: int = 6) -> list[Frame]:
    """One datagram per tick (None: lost), then ``extra`` ticks; the inbound frames."""
    frames = []
    for k in range(len(datagrams) + extra):
        now = k * 0.02
        if k < len(datagrams) and (data := datagrams[k]) is not None:
            assert engine.packet_received(call_id, data, PEER, now) is None
        frames.append(engine.tick_inbound(now + 0.001).frames[call_id])
    return frames


@pytest.fixture(scope="module")
def speech24(tmp_path_factory: pytest.TempPathFactory) -> npt.NDArray[np.int16]:
    require_speech_tools()
    path = speech_wav(SPEECH, tmp_path_factory.mktemp("speech") / "speech24.wav", rate=24000)
    pcm = np.asarray(read_wav(path).samples, dtype=np.int16).reshape(-1)
    return pcm[: pcm.shape[0] - pcm.shape[0] % FRAME_SAMPLES]


def test_speech_round_trips_between_two_engines_on_the_8000_clock(speech24: npt.NDArray[np.int16]) -> None:
    alice, bob = TickEngine(), TickEngine()
    alice.add_call(config(remote_rtp=("10.0.0.2", 5000)), now=0.0)
    bob.add_call(config(remote_rtp=("10.0.0.1", 6000)), now=0.0)
    assert alice.takes_g711 == [("g", False)]  # the session hands it PCM, never G.711 codes
    ticks = speech24.shape[0] // FRAME_SAMPLES
    sent, received = [], []
    for k in range(ticks + 8):
        now = k * 0.02
        frame = Frame(index=k, pcm=speech24[k * 480 : (k + 1) * 480]) if k < ticks else None
        for _, address, data in alice.tick_outbound({"g": frame}, now):
            assert address == ("10.0.0.2", 5000)
            sent.append(parse_rtp(data))
            assert bob.packet_received("g", data, ("10.0.0.1", 6000), now + 0.005) is None
        received.append(bob.tick_inbound(now + 0.01).frames["g"].pcm)
    assert {p.payload_type for p in sent} == {9} and {len(p.payload) for p in sent} == {160}
    steps = {(b.timestamp - a.timestamp) & 0xFFFFFFFF for a, b in itertools.pairwise(sent)}
    assert steps == {160}  # 20 ms of G.722 on its 8000 RTP clock, across the 32-bit wrap
    # espeak-ng's speech has some energy above G.722's 7 kHz band, which the round trip rightly drops.
    assert best_correlation(speech24, np.concatenate(received), 24000 // 5) > 0.9
    stats = bob.stats("g", 1.0)
    assert stats.codec == "G722" and stats.lost == 0 and stats.malformed == 0


def test_wideband_reaches_the_session_where_g711_would_cut_it() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    frames = play(engine, packets_from(tone(6000, 16000, 0.6, amp=8000)))
    out = np.concatenate([f.pcm for f in frames])
    # 6 kHz, above G.711's band, in G.722's upper sub-band (2 bits a sample, and its step size starts small)
    assert best_correlation(tone(6000, 24000, 0.6, amp=8000), out, 24000 // 10) > 0.9
    assert [f.index for f in frames] == list(range(len(frames)))


def test_the_batch_equals_each_call_alone_and_calls_come_and_go() -> None:
    hz = {"a": 300.0, "b": 2500.0, "c": 5200.0}
    streams = {name: packets_from(tone(f, 16000, 0.4, amp=6000), ssrc=i + 1) for i, (name, f) in enumerate(hz.items())}
    together = TickEngine()
    together.add_call(config("x", codec="PCMU", payload_type=0), now=0.0)  # a G.711 row beside them
    alone = {name: TickEngine() for name in hz}
    for name, engine in alone.items():
        together.add_call(config(name), now=0.0)
        engine.add_call(config(name), now=0.0)
    live = set(hz)
    sent_together: dict[str, list[bytes]] = {n: [] for n in hz}
    sent_alone: dict[str, list[bytes]] = {n: [] for n in hz}
    for k in range(len(streams["a"])):
        now = k * 0.02
        if k == 10:  # a call leaves mid-way; the others' rows and state are untouched
            together.remove_call("b")
            live.discard("b")
        agent = {n: Frame(index=k, pcm=tone(440.0 * (i + 1), 24000, 0.02, amp=5000)) for i, n in enumerate(hz)}
        for name in live:
            together.packet_received(name, streams[name][k], PEER, now)
            alone[name].packet_received(name, streams[name][k], PEER, now)
        inbound = together.tick_inbound(now + 0.001).frames
        assert set(inbound) == live | {"x"}
        for name in live:
            assert np.array_equal(inbound[name].pcm, alone[name].tick_inbound(now + 0.001).frames[name].pcm)
        for call_id, _, data in together.tick_outbound(agent, now):
            if call_id != "x":
                sent_together[call_id].append(data)
        for name in live:
            sent_alone[name] += [d for _, _, d in alone[name].tick_outbound({name: agent[name]}, now)]
    for name in hz:
        assert sent_together[name] == sent_alone[name] and len(sent_together[name]) == (10 if name == "b" else 20)


@pytest.fixture(scope="module")
def speech16(tmp_path_factory: pytest.TempPathFactory) -> npt.NDArray[np.int16]:
    require_speech_tools()
    path = speech_wav(SPEECH, tmp_path_factory.mktemp("speech") / "speech16.wav", rate=16000)
    pcm = np.asarray(read_wav(path).samples, dtype=np.int16).reshape(-1)
    return pcm[: pcm.shape[0] - pcm.shape[0] % 320]


def played(datagrams: list[bytes | None]) -> tuple[TickEngine, list[Frame]]:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    return engine, play(engine, datagrams)


def test_a_lost_packet_is_concealed_and_the_decoder_state_carries_on(speech16: npt.NDArray[np.int16]) -> None:
    whole = packets_from(speech16)
    voiced = [k for k in range(10, len(whole) - 15) if np.abs(speech16[k * 320 : (k + 1) * 320]).mean() > 1000]
    assert len(voiced) > 20
    recovered = []
    for lost_at in voiced[::6]:
        unbroken, clean = played(list(whole))
        engine, broken = played([None if k == lost_at else d for k, d in enumerate(whole)])
        stats = engine.stats("g", 10.0)
        assert stats.lost == 1 and stats.concealed == unbroken.stats("g", 10.0).concealed + 1
        # The concealed frame is the frame before, repeated and fading: not silence.
        assert broken[lost_at + 2].level_dbfs > -45  # +2: the jitter buffer's 40 ms start delay
        # Within 100 ms the decoder, whose state was kept, is back on the unbroken decode.
        after = slice(lost_at + 2 + 5, lost_at + 2 + 10)
        a = np.concatenate([f.pcm for f in clean[after]]).astype(float)
        b = np.concatenate([f.pcm for f in broken[after]]).astype(float)
        recovered.append(np.corrcoef(a, b)[0, 1])
    assert float(np.median(recovered)) > 0.95


def test_a_restarted_stream_is_decoded_from_a_reset_decoder_exactly() -> None:
    old = packets_from(tone(700, 16000, 0.4, amp=9000), ssrc=1)
    new_signal = tone(1900, 16000, 0.6, amp=7000)
    new = packets_from(new_signal, ssrc=2, first_seq=5000, first_ts=777_000)
    restarted = TickEngine()
    restarted.add_call(config(), now=0.0)
    frames = play(restarted, [*old, *new], extra=4)
    assert restarted.stats("g", 10.0).resyncs >= 1
    fresh = TickEngine()
    fresh.add_call(config(), now=0.0)
    reference = play(fresh, new, extra=4)
    # While the new stream prefills, the old one's last frame fades out (concealment); from the new stream's first
    # frame on, each frame is exactly what an engine that only ever heard the new stream plays (the 16k->24k
    # filter's memory of the old stream is under a frame): the decoder restarted with the peer's encoder.
    restarted_new, reference_new = frames[len(old) :], reference[: len(frames) - len(old)]
    first = next(i for i, f in enumerate(reference_new) if f.pcm.any())
    assert restarted_new[first - 1].pcm.any()  # the fade, where the reference was still silent
    for got, want in zip(restarted_new[first + 1 :], reference_new[first + 1 :]):
        assert np.array_equal(got.pcm, want.pcm)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "short_payload"),
        (b"\x00" * 79, "short_payload"),
        (b"\x00" * 100, "malformed_g722_size"),
        (b"\x00" * 161, "malformed_g722_size"),
        (b"\x00" * 239, "malformed_g722_size"),
    ],
)
def test_a_payload_of_the_wrong_size_is_counted_and_dropped_and_the_call_goes_on(payload: bytes, reason: str) -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    good = packets_from(tone(500, 16000, 0.4, amp=6000))
    stream: list[bytes | None] = list(good)
    bad_seq = parse_rtp(good[8]).sequence_number
    stream[8] = build_rtp(payload_type=9, sequence_number=bad_seq, timestamp=8 * 160, ssrc=9, payload=payload)
    frames = []
    for k, data in enumerate(stream):
        assert data is not None
        result = engine.packet_received("g", data, PEER, k * 0.02)
        assert result == (reason if k == 8 else None)
        frames.append(engine.tick_inbound(k * 0.02 + 0.001).frames["g"])
    stats = engine.stats("g", 1.0)
    assert stats.dropped[reason] == 1 and engine.dropped[reason] == 1
    assert stats.malformed == (1 if reason.startswith("malformed") else 0)
    assert stats.concealed == 1  # the dropped frame was concealed, the rest played
    assert min(f.level_dbfs for f in frames[4:]) > -30


def test_10_ms_packets_are_reframed_like_g711() -> None:
    signal16 = tone(800, 16000, 0.4, amp=6000)
    encoder = G722Encoder()
    datagrams = []
    for k in range(signal16.shape[0] // 160):
        payload = encoder.encode(np.ascontiguousarray(signal16[k * 160 : (k + 1) * 160]))
        assert len(payload) == 80
        datagrams.append(build_rtp(payload_type=9, sequence_number=k, timestamp=80 * k, ssrc=3, payload=payload))
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    frames = []
    for k in range(0, len(datagrams), 2):
        for data in datagrams[k : k + 2]:
            assert engine.packet_received("g", data, PEER, k * 0.01) is None
        frames.append(engine.tick_inbound(k * 0.01 + 0.001).frames["g"])
    for k in range(6):
        frames.append(engine.tick_inbound(0.4 + k * 0.02).frames["g"])
    out = np.concatenate([f.pcm for f in frames])
    assert best_correlation(tone(800, 24000, 0.4, amp=6000), out, 24000 // 10) > 0.98


def test_dtmf_beside_pt_9_runs_on_the_8000_clock_both_ways() -> None:
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    engine.send_dtmf("g", "5", duration_ms=100)
    packets = [parse_rtp(d) for k in range(12) for _, _, d in engine.tick_outbound({}, k * 0.02)]
    events = [p for p in packets if p.payload_type == 101]
    assert events and all(parse_telephone_event(p.payload)[0] == 5 for p in events)
    assert max(parse_telephone_event(p.payload)[3] for p in events) == 800  # 100 ms at 8000
    audio = [p for p in packets if p.payload_type == 9]
    assert audio and all(len(p.payload) == 160 for p in audio)
    for k in range(3):
        payload = bytes([7, 10]) + (160 * (k + 1)).to_bytes(2, "big")
        data = build_rtp(payload_type=101, sequence_number=k, timestamp=1600, ssrc=5, payload=payload, marker=k == 0)
        assert engine.packet_received("g", data, PEER, 0.0) is None
    end = build_rtp(payload_type=101, sequence_number=3, timestamp=1600, ssrc=5, payload=bytes([7, 0x8A, 2, 128]))
    engine.packet_received("g", end, PEER, 0.0)
    assert [e.digit for e in engine.tick_inbound(0.02).events] == ["7"]


def test_srtp_protects_a_g722_call_both_ways() -> None:
    ours, theirs = os.urandom(30), os.urandom(30)
    suite = "AES_CM_128_HMAC_SHA1_80"
    engine = TickEngine()
    engine.add_call(config(srtp=SrtpConfig(suite=suite, local_key=ours, remote_key=theirs)), now=0.0)
    peer = SrtpContext(SrtpConfig(suite=suite, local_key=theirs, remote_key=ours))
    plain = packets_from(tone(1000, 16000, 0.4, amp=6000))
    frames = play(engine, [peer.protect(p) for p in plain])
    assert best_correlation(tone(1000, 24000, 0.4, amp=6000), np.concatenate([f.pcm for f in frames]), 2400) > 0.98
    sent = [d for k in range(3) for _, _, d in engine.tick_outbound({}, k * 0.02)]
    assert all(len(parse_rtp(peer.unprotect(d)).payload) == 160 for d in sent)
    # A plain packet on an SRTP call is named as such (a whole number of 80-octet units), and dropped.
    assert engine.packet_received("g", plain[0], PEER, 1.0) == "srtp_plaintext"


def test_a_peer_g722_decoder_hears_the_agent(tmp_path: Path) -> None:
    """The agent's 24 kHz frames, as a phone's own G.722 decoder plays them at 16 kHz."""
    engine = TickEngine()
    engine.add_call(config(), now=0.0)
    agent = tone(3000, 24000, 0.5, amp=7000)
    payloads = []
    for k in range(25):
        for _, _, data in engine.tick_outbound({"g": Frame(index=k, pcm=agent[k * 480 : (k + 1) * 480])}, k * 0.02):
            payloads.append(parse_rtp(data).payload)
    heard = G722Decoder().decode(b"".join(payloads))
    assert best_correlation(tone(3000, 16000, 0.5, amp=7000), heard, 1600) > 0.98


def test_rtcp_sender_reports_count_the_8000_clock() -> None:
    engine = TickEngine(rtcp_interval=1.0)
    engine.add_call(config(), now=0.0)
    reports = []
    for k in range(400):  # 8 s of ticks
        now = k * 0.02
        engine.tick_outbound({}, now)
        reports += [parse_rtcp(data)[0] for _, _, data in engine.rtcp_due(now + 0.001)]
    senders = [r for r in reports if isinstance(r, SenderReport)]
    assert len(senders) >= 3
    first, last = senders[0], senders[-1]
    seconds = (last.ntp_timestamp - first.ntp_timestamp) / 2**32
    assert (last.rtp_timestamp - first.rtp_timestamp) & 0xFFFFFFFF == pytest.approx(8000 * seconds, abs=2)
    assert last.octet_count == 160 * last.packet_count
