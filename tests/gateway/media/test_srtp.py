"""SRTP/SRTCP in the media core: libsrtp round trips, the tick's inbound and outbound paths with real keys, drops."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.media.call import MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.rtcp import Bye, ReceiverReport, ReportBlock, SenderReport, build_report, parse_rtcp
from gateway.media.rtp import build_rtp, parse_rtp
from gateway.media.srtp import SrtpConfig, SrtpContext, SrtpError
from gateway.media.tick import G711Frame, TickEngine
from telcodecs.g711 import ulaw_encode

PEER = ("192.0.2.10", 4000)
OURS = bytes(range(30))  # what the gateway protects with
THEIRS = bytes(range(50, 80))  # what the phone protects with
SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")


def srtp_config(suite: str = SUITES[0], **overrides: object) -> SrtpConfig:
    fields: dict[str, object] = {"suite": suite, "local_key": OURS, "remote_key": THEIRS}
    fields.update(overrides)
    return SrtpConfig(**fields)  # type: ignore[arg-type]


def phone(suite: str = SUITES[0]) -> SrtpContext:
    """The phone's side: it protects with its key and reads ours."""
    return SrtpContext(SrtpConfig(suite=suite, local_key=THEIRS, remote_key=OURS))


def call_config(suite: str | None = SUITES[0], **overrides: object) -> MediaCallConfig:
    fields: dict[str, object] = {
        "call_id": "c1",
        "codec": "PCMU",
        "payload_type": 0,
        "telephone_event_pt": 101,
        "remote_rtp": PEER,
        "ssrc": 4242,
        "initial_sequence": 100,
        "initial_timestamp": 1000,
        "srtp": srtp_config(suite) if suite else None,
    }
    fields.update(overrides)
    return MediaCallConfig(**fields)  # type: ignore[arg-type]


def speech_codes(k: int) -> bytes:
    """20 ms of a tone as PCMU codes, different every frame (its level rises frame by frame)."""
    t = (np.arange(160) + 160 * k) / 8000
    return ulaw_encode(((2000 + 300 * k) * np.sin(2 * np.pi * 440 * t)).astype(np.int16))


def rtp(k: int, payload: bytes | None = None, *, ssrc: int = 77, pt: int = 0) -> bytes:
    return build_rtp(
        payload_type=pt,
        sequence_number=(65530 + k) & 0xFFFF,  # wraps: the rollover counter moves
        timestamp=(5000 + 160 * k) & 0xFFFFFFFF,
        ssrc=ssrc,
        payload=speech_codes(k) if payload is None else payload,
    )


# ------------------------------------------------------------------------------------------ libsrtp


@pytest.mark.parametrize("suite", SUITES)
def test_round_trip_both_directions_and_tag_size(suite: str) -> None:
    gateway, peer = SrtpContext(srtp_config(suite)), phone(suite)
    for k in range(10):
        plain = rtp(k)
        protected = peer.protect(plain)
        assert len(protected) == len(plain) + srtp_config(suite).tag_size
        assert protected[12:172] != plain[12:172]  # the payload is encrypted, the header is not
        assert protected[:12] == plain[:12]
        assert gateway.unprotect(protected) == plain
        assert peer.unprotect(gateway.protect(plain)) == plain
    report = build_report(ssrc=4242, cname="gw", sender=None, reports=())
    assert peer.unprotect_rtcp(gateway.protect_rtcp(report)) == report


def test_refusals_have_stable_reasons() -> None:
    gateway, peer = SrtpContext(srtp_config()), phone()
    protected = peer.protect(rtp(0))
    assert gateway.unprotect(protected) == rtp(0)
    with pytest.raises(SrtpError) as caught:
        gateway.unprotect(protected)
    assert caught.value.reason == "replay"
    tampered = bytearray(peer.protect(rtp(1)))
    tampered[20] ^= 1
    with pytest.raises(SrtpError) as caught:
        gateway.unprotect(bytes(tampered))
    assert caught.value.reason == "auth_failed"
    with pytest.raises(SrtpError) as caught:
        gateway.unprotect(b"\x80" + bytes(2000))
    assert caught.value.reason == "too_long"
    with pytest.raises(SrtpError) as caught:
        gateway.unprotect(b"\x80\x00")
    assert caught.value.reason in ("rejected", "auth_failed")
    assert gateway.unprotect(peer.protect(rtp(2))) == rtp(2)  # refusals leave the context working


def test_wrong_key_fails_authentication() -> None:
    stranger = SrtpContext(SrtpConfig(suite=SUITES[0], local_key=bytes(30), remote_key=OURS))
    with pytest.raises(SrtpError) as caught:
        SrtpContext(srtp_config()).unprotect(stranger.protect(rtp(0)))
    assert caught.value.reason == "auth_failed"


def test_config_is_checked_and_keys_stay_out_of_repr() -> None:
    with pytest.raises(LocalMediaError, match="not supported"):
        SrtpConfig(suite="AEAD_AES_256_GCM", local_key=OURS, remote_key=THEIRS)
    with pytest.raises(LocalMediaError, match="30 octets"):
        SrtpConfig(suite=SUITES[0], local_key=OURS[:16], remote_key=THEIRS)
    with pytest.raises(LocalMediaError, match="replay window"):
        SrtpConfig(suite=SUITES[0], local_key=OURS, remote_key=THEIRS, replay_window=32)
    assert repr(srtp_config()) == "SrtpConfig(suite='AES_CM_128_HMAC_SHA1_80', replay_window=0)"


# --------------------------------------------------------------------------------------- the tick in


def _engine(suite: str | None = SUITES[0], **overrides: object) -> TickEngine:
    engine = TickEngine()
    engine.add_call(call_config(suite, **overrides), now=0.0)
    return engine


def _play(
    engine: TickEngine, datagrams: list[bytes | None], source: tuple[str, int] = PEER
) -> list[tuple[str | None, bytes]]:
    """One datagram (or none) per tick; returns what packet_received said and the G.711 codes each tick played."""
    out = []
    for k, data in enumerate(datagrams):
        now = 0.02 * k
        said = engine.packet_received("c1", data, source, now) if data is not None else None
        frame = engine.tick_inbound(now + 0.001).frames["c1"]
        assert frame.g711 is not None
        out.append((said, frame.g711))
    return out


@pytest.mark.parametrize("suite", SUITES)
def test_inbound_srtp_plays_exactly_what_was_sent(suite: str) -> None:
    engine, peer = _engine(suite), phone(suite)
    ticks = 30
    played = _play(engine, [peer.protect(rtp(k)) for k in range(ticks)] + [None] * 4)
    assert all(said is None for said, _ in played)
    codes = [c for _, c in played]
    first = codes.index(speech_codes(0))  # after the jitter buffer's delay
    assert codes[first : first + ticks] == [speech_codes(k) for k in range(ticks)]
    stats = engine.stats("c1", 1.0)
    assert stats.srtp == suite and stats.received == ticks and stats.dropped == {}


def test_tampered_plaintext_and_replayed_packets_are_counted_and_not_played() -> None:
    engine, peer = _engine(), phone()
    protected = [peer.protect(rtp(k)) for k in range(12)]
    tampered = bytearray(protected[4])
    tampered[-1] ^= 0x40  # the tag
    datagrams: list[bytes | None] = [*protected[:4], bytes(tampered), *protected[5:]]
    datagrams[6] = rtp(6)  # a plain RTP packet where SRTP belongs
    datagrams.insert(9, protected[8])  # a replay of the packet just before
    played = _play(engine, datagrams + [None] * 4)
    assert [said for said, _ in played if said is not None] == ["srtp_auth_failed", "srtp_plaintext", "srtp_replay"]
    codes = [c for _, c in played]
    for k in (4, 6):
        assert speech_codes(k) not in codes  # neither the tampered frame nor the plain one was played
    for k in (0, 1, 2, 3, 5, 7, 8, 9, 10, 11):
        assert codes.count(speech_codes(k)) == 1  # and the replay did not play frame 8 twice
    stats = engine.stats("c1", 1.0)
    assert stats.dropped == {"srtp_auth_failed": 1, "srtp_plaintext": 1, "srtp_replay": 1}
    assert stats.received == 10
    assert engine.dropped == {"srtp_auth_failed": 1, "srtp_plaintext": 1, "srtp_replay": 1}


def test_plain_packets_into_an_srtp_call_are_named_by_their_shape() -> None:
    engine = _engine()
    event = build_rtp(payload_type=101, sequence_number=1, timestamp=1, ssrc=77, payload=b"\x01\x0a\x00\xa0")
    assert engine.packet_received("c1", event, PEER, 0.0) == "srtp_plaintext"
    assert engine.packet_received("c1", rtp(0, b"\xff" * 80), PEER, 0.0) == "srtp_plaintext"
    assert engine.packet_received("c1", rtp(0, b"\xff" * 170), PEER, 0.0) == "srtp_auth_failed"
    assert engine.packet_received("c1", b"\x00" * 40, PEER, 0.0) == "srtp_auth_failed"  # not RTP at all
    opus = _engine(codec="opus", payload_type=111)
    assert opus.packet_received("c1", rtp(0, b"\x78" + bytes(79), pt=111), PEER, 0.0) == "srtp_auth_failed"


def test_an_unauthenticated_packet_does_not_latch() -> None:
    engine, peer = _engine(latch_any_source=True), phone()
    stranger = ("198.51.100.7", 5555)
    assert engine.packet_received("c1", rtp(0), stranger, 0.0) == "srtp_plaintext"
    call = engine.call("c1")
    assert not call.latched and call.send_address == PEER
    assert engine.packet_received("c1", peer.protect(rtp(1)), ("192.0.2.10", 4010), 0.02) is None
    assert call.latched and call.send_address == ("192.0.2.10", 4010)


def test_a_new_ssrc_with_the_same_key_is_heard() -> None:
    engine, peer = _engine(), phone()
    datagrams: list[bytes | None] = [peer.protect(rtp(k)) for k in range(6)]
    datagrams += [peer.protect(rtp(k, ssrc=99)) for k in range(6, 12)]
    played = _play(engine, datagrams + [None] * 4)
    assert all(said is None for said, _ in played)
    assert speech_codes(11) in [c for _, c in played]


def test_rekey_replaces_only_the_direction_whose_key_changed() -> None:
    engine, peer = _engine(), phone()
    assert engine.packet_received("c1", peer.protect(rtp(0)), PEER, 0.0) is None
    out_before = engine.tick_outbound({"c1": None}, 0.0)[0][2]
    new_theirs = bytes(range(200, 230))
    engine.set_srtp("c1", srtp_config(remote_key=new_theirs))
    # The phone's old key no longer opens anything; its new one does.
    assert engine.packet_received("c1", peer.protect(rtp(1)), PEER, 0.02) == "srtp_auth_failed"
    rekeyed_phone = SrtpContext(SrtpConfig(suite=SUITES[0], local_key=new_theirs, remote_key=OURS))
    assert engine.packet_received("c1", rekeyed_phone.protect(rtp(2)), PEER, 0.04) is None
    # Our key did not change: the phone's receiving context carries on (no replay or rollover reset).
    peer.unprotect(out_before)
    out_after = engine.tick_outbound({"c1": None}, 0.02)[0][2]
    assert parse_rtp(peer.unprotect(out_after)).sequence_number == 101
    plain = TickEngine()
    plain.add_call(call_config(None), now=0.0)
    with pytest.raises(LocalMediaError, match="plain RTP"):
        plain.set_srtp("c1", srtp_config())


# -------------------------------------------------------------------------------------- the tick out


@pytest.mark.parametrize("suite", SUITES)
def test_outbound_packets_are_srtp_that_the_phone_reads_back(suite: str) -> None:
    secure, plain, peer = _engine(suite), _engine(None), phone(suite)
    for k in range(5):
        frame = G711Frame(index=k, g711=speech_codes(k), g711_law="pcmu")
        ((_, address, protected),) = secure.tick_outbound({"c1": frame}, 0.02 * k)
        ((_, _, expected),) = plain.tick_outbound({"c1": frame}, 0.02 * k)
        assert address == PEER
        assert protected != expected and peer.unprotect(protected) == expected
        assert parse_rtp(expected).payload == speech_codes(k)
    assert secure.stats("c1", 0.1).octets_sent == 5 * 160  # RTP payload octets, as RFC 3550 counts them


def test_rtcp_both_ways_and_the_bye() -> None:
    engine, peer = _engine(), phone()
    for k in range(3):
        engine.packet_received("c1", peer.protect(rtp(k)), PEER, 0.02 * k)
        engine.tick_outbound({"c1": None}, 0.02 * k)
    ((_, address, report),) = engine.rtcp_due(10.0)
    assert address == (PEER[0], PEER[1] + 1)
    (sender,) = parse_rtcp(peer.unprotect_rtcp(report))[:1]
    assert isinstance(sender, SenderReport) and sender.ssrc == 4242 and sender.packet_count == 3
    # The phone's SRTCP receiver report is read; a plain one is refused.
    block = ReportBlock(4242, 0, 0, 3, 0, 0, 0)
    theirs = build_report(ssrc=77, cname="phone", sender=None, reports=(block,))
    assert isinstance(parse_rtcp(theirs)[0], ReceiverReport)
    rtcp_source = (PEER[0], PEER[1] + 1)
    assert engine.rtcp_received("c1", theirs, rtcp_source, 10.1) == "srtcp_unencrypted"
    tampered = bytearray(peer.protect_rtcp(theirs))
    tampered[10] ^= 1
    assert engine.rtcp_received("c1", bytes(tampered), rtcp_source, 10.1) == "srtcp_auth_failed"
    assert engine.call("c1").remote_report is None
    assert engine.rtcp_received("c1", peer.protect_rtcp(theirs), rtcp_source, 10.2) is None
    assert engine.call("c1").remote_report == block
    ((_, _, bye),) = engine.remove_call("c1")
    assert any(isinstance(p, Bye) and p.ssrcs == (4242,) for p in parse_rtcp(peer.unprotect_rtcp(bye)))


def test_rtcp_mux_srtcp_on_the_rtp_port() -> None:
    engine, peer = _engine(rtcp_mux=True), phone()
    theirs = build_report(ssrc=77, cname="phone", sender=None, reports=(ReportBlock(4242, 0, 0, 3, 0, 0, 0),))
    assert engine.packet_received("c1", peer.protect_rtcp(theirs), PEER, 0.0) is None
    assert engine.call("c1").remote_report is not None
    assert engine.packet_received("c1", theirs, PEER, 0.0) == "srtcp_unencrypted"
