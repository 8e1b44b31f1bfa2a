"""SDP parsing, serialization and RFC 3264 offer/answer against realistic offers of common SIP stacks."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sip.errors import RemoteProtocolError
from gateway.sip.sdp import (
    Attribute,
    Codec,
    Connection,
    LocalMedia,
    NegotiatedMedia,
    NoCommonCodec,
    OpusParameters,
    Rtcp,
    SdpError,
    SessionDescription,
    build_answer,
    build_offer,
    negotiate,
    next_session_version,
    parse_sdp,
)


def sdp(text: str) -> bytes:
    """Test offers are written one line per line; the wire form is CRLF-terminated."""
    return "".join(line.strip() + "\r\n" for line in text.strip().splitlines()).encode()


BARESIP = sdp("""
    v=0
    o=- 1932468906 2051235871 IN IP4 192.168.1.20
    s=-
    c=IN IP4 192.168.1.20
    t=0 0
    m=audio 10000 RTP/AVP 96 0 8 101
    b=AS:64
    a=rtpmap:96 opus/48000/2
    a=fmtp:96 stereo=1;sprop-stereo=1
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-15
    a=rtcp-rsize
    a=ptime:20
    a=sendrecv
    a=label:1
    a=ssrc:2914412391 cname:3e1a0e2b-6b0e-4a8e-bb32-d6f0e6b5a7c3
""")

PJSUA = sdp("""
    v=0
    o=- 3913571398 3913571398 IN IP4 10.0.0.5
    s=pjmedia
    b=AS:84
    t=0 0
    a=X-nat:0
    m=audio 4000 RTP/AVP 96 9 8 0 101 120
    c=IN IP4 10.0.0.5
    b=TIAS:64000
    a=rtpmap:96 opus/48000/2
    a=fmtp:96 useinbandfec=1
    a=rtpmap:9 G722/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:101 telephone-event/48000
    a=fmtp:101 0-16
    a=rtpmap:120 telephone-event/8000
    a=fmtp:120 0-16
    a=rtcp:4001 IN IP4 10.0.0.5
    a=ssrc:1234567 cname:5d1a2a4f4b6d3c21
    a=sendrecv
""")

# A browser's audio section as a WebRTC-to-SIP bridge forwards it (DTLS terminated, plain RTP/AVPF).
CHROME_LIKE = sdp("""
    v=0
    o=- 4611731400430051336 2 IN IP4 127.0.0.1
    s=-
    t=0 0
    a=extmap-allow-mixed
    a=msid-semantic: WMS stream0
    m=audio 51372 RTP/AVPF 111 63 9 0 8 13 110 126
    c=IN IP4 198.51.100.7
    a=rtcp:51373 IN IP4 198.51.100.7
    a=mid:0
    a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level
    a=rtpmap:111 opus/48000/2
    a=rtcp-fb:111 transport-cc
    a=fmtp:111 minptime=10;useinbandfec=1;usedtx=1;maxaveragebitrate=32000
    a=rtpmap:63 red/48000/2
    a=fmtp:63 111/111
    a=rtpmap:9 G722/8000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:13 CN/8000
    a=rtpmap:110 telephone-event/48000
    a=rtpmap:126 telephone-event/8000
    a=sendrecv
    a=msid:stream0 track0
""")

ASTERISK = sdp("""
    v=0
    o=- 1234 1235 IN IP4 203.0.113.10
    s=Asterisk
    c=IN IP4 203.0.113.10
    t=0 0
    m=audio 15062 RTP/AVP 8 0 3 101
    a=rtpmap:8 PCMA/8000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:3 GSM/8000
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-16
    a=ptime:20
    a=maxptime:150
    a=sendrecv
    m=video 15064 RTP/AVP 99
    a=rtpmap:99 H264/90000
    a=fmtp:99 profile-level-id=42801F
    a=sendrecv
""")

IPV6 = sdp("""
    v=0
    o=- 20518 0 IN IP6 2001:db8::10
    s=-
    c=IN IP6 2001:db8::10
    t=0 0
    m=audio 49170 RTP/AVP 8 0
    a=ptime:40
""")

US = LocalMedia()


def test_parse_baresip_offer_fields() -> None:
    offer = parse_sdp(BARESIP)
    assert offer.origin.session_id == 1932468906 and offer.origin.session_version == 2051235871
    assert offer.connection == Connection(address="192.168.1.20")
    (audio,) = offer.media
    assert (audio.media, audio.port, audio.proto, audio.formats) == ("audio", 10000, "RTP/AVP", ("96", "0", "8", "101"))
    assert audio.codecs[0] == Codec(
        payload_type=96, name="opus", clock_rate=48000, channels=2, fmtp="stereo=1;sprop-stereo=1"
    )
    assert audio.codec(101) == Codec(payload_type=101, name="telephone-event", clock_rate=8000, fmtp="0-15")
    assert audio.bandwidths == ("AS:64",)
    assert audio.ptime == 20 and audio.direction == "sendrecv"
    assert Attribute(name="rtcp-rsize") in audio.attributes
    assert Attribute(name="label", value="1") in audio.attributes


def test_baresip_offer_default_preference_takes_pcmu_keeps_te() -> None:
    got = negotiate(parse_sdp(BARESIP), local=US)
    assert (got.codec_name, got.payload_type, got.clock_rate, got.channels) == ("PCMU", 0, 8000, 1)
    assert (got.telephone_event_payload_type, got.telephone_event_clock_rate) == (101, 8000)
    assert got.remote_rtp == ("192.168.1.20", 10000)
    assert got.remote_rtcp == ("192.168.1.20", 10001) and got.remote_rtcp_port == 10001
    assert got.direction == "sendrecv" and got.ptime == 20 and not got.on_hold
    assert got.opus is None and got.local_fmtp == ""


def test_pjsua_offer_with_two_telephone_events_matches_codec_clock() -> None:
    offer = parse_sdp(PJSUA)
    g711 = negotiate(offer, local=US, preferences=("PCMA", "PCMU"))
    assert (g711.codec_name, g711.payload_type) == ("PCMA", 8)
    assert (g711.telephone_event_payload_type, g711.telephone_event_clock_rate) == (120, 8000)
    opus = negotiate(offer, local=US, preferences=("opus", "PCMU"))
    assert (opus.codec_name, opus.payload_type, opus.clock_rate, opus.channels) == ("opus", 96, 48000, 2)
    assert (opus.telephone_event_payload_type, opus.telephone_event_clock_rate) == (101, 48000)
    assert opus.opus == OpusParameters(useinbandfec=True)
    # a=rtcp names the port and address explicitly; media-level c= applies (no session-level c=).
    assert opus.remote_rtp == ("10.0.0.5", 4000) and opus.remote_rtcp == ("10.0.0.5", 4001)


def test_chrome_like_offer_opus_first_with_48k_events_and_fmtp() -> None:
    offer = parse_sdp(CHROME_LIKE)
    got = negotiate(offer, local=US, preferences=("opus", "PCMU", "PCMA"))
    assert (got.codec_name, got.payload_type) == ("opus", 111)
    assert (got.telephone_event_payload_type, got.telephone_event_clock_rate) == (110, 48000)
    assert got.opus == OpusParameters(useinbandfec=True, usedtx=True, minptime=10, maxaveragebitrate=32000)
    assert got.remote_rtp == ("198.51.100.7", 51372) and got.remote_rtcp_port == 51373
    # With G.711 preferred the 8 kHz event at 126 goes with it, not the 48 kHz one.
    g711 = negotiate(offer, local=US)
    assert (g711.payload_type, g711.telephone_event_payload_type) == (0, 126)


def test_chrome_srtp_offer_is_488() -> None:
    dtls = CHROME_LIKE.replace(b"RTP/AVPF", b"UDP/TLS/RTP/SAVPF")
    with pytest.raises(NoCommonCodec) as info:
        negotiate(parse_sdp(dtls), local=US)
    assert info.value.status_code == 488


def test_asterisk_offer_video_rejected_in_answer() -> None:
    offer = parse_sdp(ASTERISK)
    got = negotiate(offer, local=US)
    assert (got.codec_name, got.payload_type, got.telephone_event_payload_type) == ("PCMU", 0, 101)
    assert offer.media[0].maxptime == 150
    answer = build_answer(offer, got, local_address="192.0.2.1", local_port=20000, session_id=7, session_version=1)
    text = answer.to_bytes().decode()
    assert text == (
        "v=0\r\n"
        "o=- 7 1 IN IP4 192.0.2.1\r\n"
        "s=-\r\n"
        "c=IN IP4 192.0.2.1\r\n"
        "t=0 0\r\n"
        "m=audio 20000 RTP/AVP 0 101\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\n"
        "a=fmtp:101 0-15\r\n"
        "a=ptime:20\r\n"
        "a=sendrecv\r\n"
        "m=video 0 RTP/AVP 99\r\n"
    )
    assert len(answer.media) == len(offer.media)


def test_ipv6_offer_static_payload_types_without_rtpmap() -> None:
    offer = parse_sdp(IPV6)
    assert offer.connection == Connection(address="2001:db8::10", address_type="IP6")
    assert [c.name for c in offer.media[0].codecs] == ["PCMA", "PCMU"]
    got = negotiate(offer, local=US)
    assert got.remote_rtp == ("2001:db8::10", 49170) and got.remote_rtcp == ("2001:db8::10", 49171)
    assert got.ptime == 40 and got.telephone_event_payload_type is None
    answer = build_answer(offer, got, local_address="2001:db8::1", local_port=30000, session_id=1, session_version=1)
    assert b"c=IN IP6 2001:db8::1\r\n" in answer.to_bytes()
    assert b"o=- 1 1 IN IP6 2001:db8::1\r\n" in answer.to_bytes()
    assert b"m=audio 30000 RTP/AVP 0\r\n" in answer.to_bytes()


def test_preference_order_is_ours_and_offer_pt_numbers_are_kept() -> None:
    offer = parse_sdp(
        sdp("""
        v=0
        o=- 1 1 IN IP4 10.1.1.1
        s=-
        c=IN IP4 10.1.1.1
        t=0 0
        m=audio 7000 RTP/AVP 98 97 0 8
        a=rtpmap:98 opus/48000/2
        a=rtpmap:97 OPUS/48000/2
        a=rtpmap:0 PCMU/8000
        a=rtpmap:8 PCMA/8000
    """)
    )
    assert negotiate(offer, local=US, preferences=("PCMA", "opus")).payload_type == 8
    # Two opus entries: the offerer's first one wins; the name match is case-insensitive.
    assert negotiate(offer, local=US, preferences=("opus",)).payload_type == 98
    assert negotiate(offer, local=US, preferences=("PCMU", "PCMA")).payload_type == 0


def test_dynamic_payload_types_are_remapped_by_name_not_number() -> None:
    # PCMU announced at a dynamic number (legal, if odd) and 0 reused for nothing we know.
    offer = parse_sdp(
        sdp("""
        v=0
        o=- 1 1 IN IP4 10.1.1.1
        s=-
        c=IN IP4 10.1.1.1
        t=0 0
        m=audio 7000 RTP/AVP 100 127 102
        a=rtpmap:100 PCMU/8000
        a=rtpmap:127 telephone-event/8000
    """)
    )
    got = negotiate(offer, local=US)
    assert (got.payload_type, got.telephone_event_payload_type) == (100, 127)
    assert offer.media[0].formats == ("100", "127", "102")  # 102 has no rtpmap: kept, but no codec
    assert [c.payload_type for c in offer.media[0].codecs] == [100, 127]


def test_no_common_codec_is_488() -> None:
    offer = parse_sdp(
        sdp("""
        v=0
        o=- 1 1 IN IP4 10.1.1.1
        s=-
        c=IN IP4 10.1.1.1
        t=0 0
        m=audio 7000 RTP/AVP 3 18
    """)
    )
    with pytest.raises(NoCommonCodec) as info:
        negotiate(offer, local=US)
    assert isinstance(info.value, RemoteProtocolError) and info.value.status_code == 488
    assert "no common audio codec" in str(info.value)
    # opus in the offer but not in our preferences is no match either
    opus_only = parse_sdp(BARESIP.replace(b" 96 0 8 101", b" 96 101"))
    with pytest.raises(NoCommonCodec):
        negotiate(opus_only, local=US, preferences=("PCMA", "PCMU"))


def test_audio_port_zero_is_skipped_for_the_next_audio_stream() -> None:
    offer = parse_sdp(
        sdp("""
        v=0
        o=- 1 1 IN IP4 10.1.1.1
        s=-
        c=IN IP4 10.1.1.1
        t=0 0
        m=audio 0 RTP/AVP 0
        m=audio 6000 RTP/AVP 9 8
        m=audio 6002 RTP/AVP 0
    """)
    )
    got = negotiate(offer, local=US)
    assert (got.media_index, got.payload_type, got.remote_rtp) == (1, 8, ("10.1.1.1", 6000))
    answer = build_answer(offer, got, local_address="10.9.9.9", local_port=4000, session_id=2, session_version=3)
    assert [(m.port, m.formats) for m in answer.media] == [(0, ("0",)), (4000, ("8",)), (0, ("0",))]


@pytest.mark.parametrize(
    ("offered", "local", "ours", "on_hold"),
    [
        ("sendrecv", "sendrecv", "sendrecv", False),
        ("sendonly", "sendrecv", "recvonly", True),
        ("recvonly", "sendrecv", "sendonly", False),
        ("inactive", "sendrecv", "inactive", True),
        ("sendrecv", "sendonly", "sendonly", False),  # we hold the remote
        ("sendonly", "sendonly", "inactive", True),  # both hold
        ("recvonly", "recvonly", "inactive", False),
    ],
)
def test_direction_mapping(offered: str, local: str, ours: str, on_hold: bool) -> None:
    offer = parse_sdp(BARESIP.replace(b"a=sendrecv", f"a={offered}".encode()))
    got = negotiate(offer, local=LocalMedia(direction=local))  # type: ignore[arg-type]
    assert (got.direction, got.on_hold) == (ours, on_hold)
    answer = build_answer(offer, got, local_address="10.0.0.1", local_port=5000, session_id=1, session_version=1)
    assert answer.media[0].direction == ours


def test_session_level_direction_applies_and_media_level_overrides() -> None:
    session_only = ASTERISK.replace(b"t=0 0\r\n", b"t=0 0\r\na=sendonly\r\n").replace(b"a=sendrecv\r\n", b"")
    offer = parse_sdp(session_only)
    assert offer.direction == "sendonly" and offer.media[0].direction is None
    assert negotiate(offer, local=US).direction == "recvonly"
    overridden = ASTERISK.replace(b"t=0 0\r\n", b"t=0 0\r\na=inactive\r\n")
    assert negotiate(parse_sdp(overridden), local=US).direction == "sendrecv"


def test_old_style_hold_with_zero_address() -> None:
    offer = parse_sdp(ASTERISK.replace(b"c=IN IP4 203.0.113.10", b"c=IN IP4 0.0.0.0"))
    got = negotiate(offer, local=US)
    assert got.on_hold and got.direction == "recvonly" and got.remote_rtp == ("0.0.0.0", 15062)
    assert offer.is_hold(offer.media[0])
    assert not parse_sdp(ASTERISK).is_hold(parse_sdp(ASTERISK).media[0])


def test_media_level_connection_overrides_session_level() -> None:
    text = BARESIP.replace(
        b"m=audio 10000 RTP/AVP 96 0 8 101\r\n", b"m=audio 10000 RTP/AVP 96 0 8 101\r\nc=IN IP4 172.16.0.9\r\n"
    )
    got = negotiate(parse_sdp(text), local=US)
    assert got.remote_rtp == ("172.16.0.9", 10000) and got.remote_rtcp == ("172.16.0.9", 10001)


def test_rtcp_attribute_without_address_uses_the_rtp_address() -> None:
    got = negotiate(parse_sdp(BARESIP.replace(b"a=rtcp-rsize", b"a=rtcp:10007")), local=US)
    assert got.remote_rtcp == ("192.168.1.20", 10007)
    assert parse_sdp(BARESIP.replace(b"a=rtcp-rsize", b"a=rtcp:10007")).media[0].rtcp == Rtcp(port=10007)


@pytest.mark.parametrize(
    ("lines", "ptime"),
    [("a=ptime:20", 20), ("a=ptime:40", 40), ("a=ptime:30", 20), ("a=ptime:10", 20), ("a=ptime:60.0", 60)],
)
def test_ptime_rule(lines: str, ptime: int) -> None:
    got = negotiate(parse_sdp(BARESIP.replace(b"a=ptime:20", lines.encode())), local=US)
    assert got.ptime == ptime


def test_ptime_capped_by_maxptime_and_absent_is_default() -> None:
    capped = BARESIP.replace(b"a=ptime:20", b"a=ptime:60\r\na=maxptime:40")
    assert negotiate(parse_sdp(capped), local=US).ptime == 20
    assert negotiate(parse_sdp(BARESIP.replace(b"a=ptime:20\r\n", b"")), local=US).ptime == 20


def test_telephone_event_not_answered_when_disabled_or_not_offered() -> None:
    assert negotiate(parse_sdp(BARESIP), local=LocalMedia(telephone_event=False)).telephone_event_payload_type is None
    assert negotiate(parse_sdp(IPV6), local=US).telephone_event_clock_rate is None


def test_opus_answer_carries_local_fmtp_and_48k_event() -> None:
    offer = parse_sdp(PJSUA)
    local = LocalMedia(opus_fmtp="useinbandfec=1")
    got = negotiate(offer, local=local, preferences=("opus",))
    answer = build_answer(offer, got, local_address="10.0.0.1", local_port=5000, session_id=1, session_version=1)
    audio = answer.media[0]
    assert audio.formats == ("96", "101")
    assert audio.codecs == (
        Codec(payload_type=96, name="opus", clock_rate=48000, channels=2, fmtp="useinbandfec=1"),
        Codec(payload_type=101, name="telephone-event", clock_rate=48000, fmtp="0-15"),
    )
    assert b"a=rtpmap:96 opus/48000/2\r\na=fmtp:96 useinbandfec=1\r\n" in answer.to_bytes()


def test_build_offer_and_negotiate_its_own_answer() -> None:
    offer = build_offer(local_address="192.0.2.5", local_port=40000, session_id=99, session_version=1)
    text = offer.to_bytes()
    assert b"m=audio 40000 RTP/AVP 0 8 111 9 110 101\r\n" in text
    assert b"a=rtpmap:9 G722/8000\r\n" in text
    assert b"a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10;useinbandfec=1\r\n" in text
    assert b"a=rtpmap:110 telephone-event/48000\r\n" in text and b"a=rtpmap:101 telephone-event/8000\r\n" in text
    assert parse_sdp(text) == offer
    # The remote answers with opus; reading its answer uses the same negotiate().
    remote = negotiate(offer, local=US, preferences=("opus",))
    answer = build_answer(offer, remote, local_address="198.51.100.1", local_port=6000, session_id=5, session_version=5)
    ours = negotiate(parse_sdp(answer.to_bytes()), local=US)
    assert (ours.codec_name, ours.payload_type, ours.telephone_event_payload_type) == ("opus", 111, 110)
    assert ours.remote_rtp == ("198.51.100.1", 6000)


def test_build_offer_options() -> None:
    offer = build_offer(
        local_address="::1",
        local_port=40000,
        session_id=1,
        session_version=1,
        preferences=("PCMA",),
        telephone_event=False,
        direction="sendonly",
    )
    (audio,) = offer.media
    assert audio.formats == ("8",) and audio.direction == "sendonly"
    assert offer.connection == Connection(address="::1", address_type="IP6")
    with pytest.raises(ValueError, match="preferences"):
        build_offer(local_address="::1", local_port=1, session_id=1, session_version=1, preferences=("G729",))
    with pytest.raises(ValueError, match="preferences"):
        negotiate(parse_sdp(BARESIP), local=US, preferences=())


def test_next_session_version_bumps_only_on_change() -> None:
    first = build_offer(local_address="192.0.2.5", local_port=40000, session_id=42, session_version=1)
    assert next_session_version(None, first) is first
    # A re-offer built afresh (new id/version from the caller) but identical keeps id and version.
    same = build_offer(local_address="192.0.2.5", local_port=40000, session_id=777, session_version=9)
    assert next_session_version(first, same) == first
    held = build_offer(
        local_address="192.0.2.5", local_port=40000, session_id=777, session_version=9, direction="sendonly"
    )
    second = next_session_version(first, held)
    assert (second.origin.session_id, second.origin.session_version) == (42, 2)
    assert second.media[0].direction == "sendonly"
    # Sending the held offer again (a refresh) keeps version 2; going back to sendrecv makes it 3.
    assert next_session_version(second, held) == second
    assert next_session_version(second, same).origin.session_version == 3


@pytest.mark.parametrize("raw", [BARESIP, PJSUA, CHROME_LIKE, ASTERISK, IPV6])
def test_round_trip_parse_serialize(raw: bytes) -> None:
    parsed = parse_sdp(raw)
    wire = parsed.to_bytes()
    assert parse_sdp(wire) == parsed
    assert parse_sdp(wire).to_bytes() == wire


def test_serialize_keeps_extra_fields_in_rfc_order() -> None:
    raw = sdp("""
        v=0
        o=alice 2890844526 2890844527 IN IP4 host.example.com
        s=Call
        i=A call
        u=http://www.example.com/call
        e=alice@example.com
        p=+1 617 555-6011
        c=IN IP4 224.2.17.12/127
        t=2873397496 2873404696
        r=604800 3600 0 90000
        z=2882844526 -1h
        k=prompt
        a=recvonly
        m=audio 49170/2 RTP/AVP 0
        i=voice
        k=prompt
    """)
    parsed = parse_sdp(raw)
    assert parsed.connection == Connection(address="224.2.17.12", multicast_suffix="/127")
    assert parsed.media[0].port_count == 2 and parsed.origin.address == "host.example.com"
    # Static payload types are always written with their rtpmap (harmless, and what most stacks expect).
    assert parsed.to_bytes() == raw + b"a=rtpmap:0 PCMU/8000\r\n"


def test_payload_type_numbers_with_leading_zeros_are_normalized() -> None:
    parsed = parse_sdp(BARESIP.replace(b"RTP/AVP 96 0 8 101", b"RTP/AVP 096 0 8 101").replace(b"fmtp:96", b"fmtp:096"))
    assert parsed.media[0].formats == ("96", "0", "8", "101")
    assert parsed.media[0].codec(96) == parse_sdp(BARESIP).media[0].codec(96)
    assert parse_sdp(parsed.to_bytes()) == parsed


def test_bare_lf_blank_lines_and_trailing_blanks_are_tolerated() -> None:
    assert parse_sdp(BARESIP.replace(b"\r\n", b"\n") + b"\n\n") == parse_sdp(BARESIP)
    assert parse_sdp(BARESIP.replace(b"\r\n", b" \t\r\n")) == parse_sdp(BARESIP)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "must start with v=0"),
        (b"o=- 1 1 IN IP4 1.2.3.4\r\n", "must start with v=0"),
        (b"v=0\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\nm=audio 1 RTP/AVP 0\r\n", "missing o= line"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nc=IN IP4 1.2.3.4\r\nm=audio 1 RTP/AVP 0\r\n", "missing s= line"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nt=0 0\r\n", "missing m= line"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nt=0 0\r\nm=audio 1 RTP/AVP 0\r\n", "line 5: no c= line"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nm=audio 70000 RTP/AVP 0\r\n", "line 5: port"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nm=audio x RTP/AVP 0\r\n", "bad port 'x'"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 1.2.3.4\r\nm=audio 1 RTP/AVP 200\r\n", "payload type"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nhello\r\n", "line 4: expected <type>=<value>"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nx=1\r\n", "unknown line type x="),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4 999.1.1.1\r\n", "bad address"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP6 1.2.3.4\r\n", "is not IP6"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nc=IN IP4\r\n", "bad c= line"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nm=audio 1 RTP/AVP 0\r\nt=0 0\r\n", "t= is not allowed inside"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nm=audio 1 RTP/AVP 0\r\na=rtpmap:0 PCMU\r\n", "bad a=rtpmap"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nm=audio 1 RTP/AVP 0\r\na=ptime:abc\r\n", "bad a=ptime"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nm=audio 1 RTP/AVP 0\r\na=rtcp:99999\r\n", "a=rtcp port"),
        (b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\na=sendrecv:1\r\n", "takes no value"),
        (b"v=0\r\no=one two\r\n", "bad o= line"),
        (b"v=0\r\n\xff\r\n", "not UTF-8"),
    ],
)
def test_malformed_input_raises_precise_sdp_error(raw: bytes, message: str) -> None:
    with pytest.raises(SdpError, match=message) as info:
        parse_sdp(raw)
    assert info.value.status_code == 400


def test_hand_built_description_without_connection_is_refused() -> None:
    offer = parse_sdp(BARESIP)
    bare = dataclasses.replace(offer, connection=None)
    with pytest.raises(NoCommonCodec, match="no connection address"):
        negotiate(bare, local=US)


def test_negotiated_media_is_frozen() -> None:
    got: NegotiatedMedia = negotiate(parse_sdp(BARESIP), local=US)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.ptime = 40  # type: ignore[misc]
    assert isinstance(parse_sdp(BARESIP), SessionDescription)


_SDP_ALPHABET = st.sampled_from(
    ["v=0", "o=- 1 1 IN IP4 10.0.0.1", "s=-", "c=IN IP4 10.0.0.1", "c=IN IP6 ::1", "t=0 0", "m=audio 4000 RTP/AVP 0 8",
     "m=video 0 RTP/AVP 96", "a=rtpmap:96 opus/48000/2", "a=fmtp:96 x", "a=ptime:20", "a=sendonly", "a=rtcp:4001",
     "b=AS:64", "i=x", "\r\n", "\n", " ", "=", ":", "/", "0", "99999", "a=", "m=", "c=IN IP4 "]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_SDP_ALPHABET, st.text(max_size=12)), max_size=30))
def test_fuzz_parse_raises_only_sdp_error(pieces: list[str]) -> None:
    data = "\r\n".join(pieces).encode("utf-8", "surrogatepass")
    try:
        parsed = parse_sdp(data)
    except SdpError:
        return
    # Whatever parses must survive a round trip unchanged.
    assert parse_sdp(parsed.to_bytes()) == parsed


_VALID_LINES = st.sampled_from(
    ["c=IN IP4 10.0.0.1", "c=IN IP6 2001:db8::5", "b=AS:64", "i=x", "k=prompt", "m=audio 4000 RTP/AVP 0 8 101",
     "m=audio 0 RTP/AVP 0", "m=video 5000 RTP/AVP 96", "m=image 0 udptl t38", "a=rtpmap:101 telephone-event/8000",
     "a=rtpmap:96 opus/48000/2", "a=fmtp:101 0-15", "a=fmtp:96 useinbandfec=1", "a=ptime:20", "a=maxptime:40",
     "a=sendonly", "a=inactive", "a=rtcp:4001", "a=rtcp:4001 IN IP4 10.0.0.2", "a=label:1", "a=rtcp-mux",
     "a=rtpmap:8 PCMA/8000", "a=rtpmap:0 PCMU/8000", "m=audio 4002 RTP/AVP 096", "a=fmtp:096 stereo=1",
     "a=rtpmap:96 OPUS/48000", "a=fmtp:0 x=1", "a=fmtp:x y"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_VALID_LINES, max_size=25))
def test_fuzz_well_formed_lines_round_trip_or_raise_sdp_error(lines: list[str]) -> None:
    data = "\r\n".join(["v=0", "o=- 1 1 IN IP4 10.0.0.1", "s=-", "t=0 0", *lines, ""]).encode()
    try:
        parsed = parse_sdp(data)
    except SdpError:
        return  # e.g. a duplicate c= line, a media section without c=, no m= at all
    again = parse_sdp(parsed.to_bytes())
    assert again == parsed
    assert again.to_bytes() == parsed.to_bytes()
    try:  # negotiation either yields an answer that parses back with as many m= lines, or a 488
        got = negotiate(parsed, local=US)
    except NoCommonCodec:
        return
    answer = build_answer(parsed, got, local_address="10.9.9.9", local_port=4000, session_id=1, session_version=1)
    assert len(parse_sdp(answer.to_bytes()).media) == len(parsed.media)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    try:
        parsed = parse_sdp(data)
    except SdpError as exc:
        assert exc.status_code == 400
        return
    assert parse_sdp(parsed.to_bytes()) == parsed


DESK_PHONE_G722 = sdp("""
    v=0
    o=- 20518 0 IN IP4 192.0.2.44
    s=SDP data
    c=IN IP4 192.0.2.44
    t=0 0
    m=audio 11780 RTP/AVP 9 0 8 18 101
    a=rtpmap:9 G722/8000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:18 G729/8000
    a=fmtp:18 annexb=no
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-15
    a=ptime:20
    a=sendrecv
""")


def test_g722_static_payload_type_9_at_its_8000_rtp_clock_with_8k_telephone_events() -> None:
    got = negotiate(parse_sdp(DESK_PHONE_G722), local=US, preferences=("G722", "PCMU"))
    assert (got.codec_name, got.payload_type, got.clock_rate, got.channels) == ("G722", 9, 8000, 1)
    assert (got.telephone_event_payload_type, got.telephone_event_clock_rate) == (101, 8000)
    answer = build_answer(
        parse_sdp(DESK_PHONE_G722), got, local_address="192.0.2.1", local_port=30000, session_id=1, session_version=1
    ).to_bytes()
    assert b"m=audio 30000 RTP/AVP 9 101\r\n" in answer and b"a=rtpmap:9 G722/8000\r\n" in answer
    # Our order decides: with G.711 first, the same offer gets PCMU.
    assert negotiate(parse_sdp(DESK_PHONE_G722), local=US, preferences=("PCMU", "G722")).codec_name == "PCMU"


def test_g722_without_rtpmap_is_the_static_payload_type_and_g722_16000_is_not_g722() -> None:
    bare = DESK_PHONE_G722.replace(b"a=rtpmap:9 G722/8000\r\n", b"")
    assert negotiate(parse_sdp(bare), local=US, preferences=("G722",)).payload_type == 9
    # RFC 3551 §4.5.2 says 8000; a stack that writes the sampling rate signals something we would mis-clock.
    wrong = DESK_PHONE_G722.replace(b"m=audio 11780 RTP/AVP 9 0 8 18 101", b"m=audio 11780 RTP/AVP 97 0 101").replace(
        b"a=rtpmap:9 G722/8000", b"a=rtpmap:97 G722/16000"
    )
    assert negotiate(parse_sdp(wrong), local=US, preferences=("G722", "PCMU")).codec_name == "PCMU"
    with pytest.raises(NoCommonCodec):
        negotiate(parse_sdp(wrong), local=US, preferences=("G722",))
    offer = build_offer(local_address="192.0.2.5", local_port=1, session_id=1, session_version=1, preferences=("G722",))
    assert b"m=audio 1 RTP/AVP 9 101\r\n" in offer.to_bytes() and b"a=rtpmap:9 G722/8000\r\n" in offer.to_bytes()
