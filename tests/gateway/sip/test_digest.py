"""Digest authentication: RFC worked examples, client/server round trips, stale, replay and hostile input."""

from __future__ import annotations

import base64
import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sip.auth import DigestAuthenticator, DigestClientCredentials
from gateway.sip.digest import (
    ALGORITHMS,
    Algorithm,
    DigestChallenge,
    DigestChallenger,
    DigestError,
    DigestOutcome,
    Ha1,
    authorization,
    compute_response,
    ha1_of,
    parse_auth_params,
    parse_challenge,
    parse_credentials,
    select_challenge,
)
from gateway.sip.errors import RemoteProtocolError
from gateway.sip.events import CallOffered, OutboundCallAnswered
from gateway.sip.sdp import LocalMedia, build_answer, build_offer, negotiate, parse_sdp
from tests.gateway.sip.sipnet import Net

SECRET = b"0123456789abcdef-test-secret"
SALT = bytes(range(16))
T0 = 1_700_000_000.0
PASSWORDS = {"alice": "wonderland", "bob": 'p"a\\ss, word'}


def lookup(username: str) -> str | Ha1 | None:
    return PASSWORDS.get(username)


def challenger(**overrides: object) -> DigestChallenger:
    options: dict[str, object] = {"realm": "gw.example.com", "credentials": lookup, "nonce_secret": SECRET}
    options.update(overrides)
    return DigestChallenger(**options)  # type: ignore[arg-type]


def salt(n: int) -> bytes:
    return n.to_bytes(16, "big")


# ----------------------------------------------------------------------------------------- RFC examples

RFC2617_AUTHORIZATION = (
    'Digest username="Mufasa",\r\n realm="testrealm@host.com",\r\n nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",'
    '\r\n uri="/dir/index.html",\r\n qop=auth,\r\n nc=00000001,\r\n cnonce="0a4f113b",'
    '\r\n response="6629fae49393a05397450978507c4ef1",\r\n opaque="5ccc069c403ebaf9f0171e9517f40e41"'
)


def test_rfc2617_section_3_5_example() -> None:
    challenge = parse_challenge(
        'Digest realm="testrealm@host.com", qop="auth,auth-int", '
        'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"'
    )
    assert challenge == DigestChallenge(
        realm="testrealm@host.com",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        qop=("auth", "auth-int"),
        opaque="5ccc069c403ebaf9f0171e9517f40e41",
    )
    header = authorization(
        challenge,
        method="GET",
        uri="/dir/index.html",
        username="Mufasa",
        password="Circle Of Life",
        cnonce="0a4f113b",
        nc=1,
    )
    ours = parse_credentials(header)
    theirs = parse_credentials(RFC2617_AUTHORIZATION)  # folded lines as printed in the RFC
    assert ours == theirs
    assert ours.response == "6629fae49393a05397450978507c4ef1"
    assert 'response="6629fae49393a05397450978507c4ef1"' in header and "nc=00000001" in header and "qop=auth" in header


RFC7616_CHALLENGE = (
    'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm={algorithm}, '
    'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
)


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc7616_section_3_9_1_examples(algorithm: str, expected: str) -> None:
    challenge = parse_challenge(RFC7616_CHALLENGE.format(algorithm=algorithm))
    assert challenge.algorithm == algorithm and challenge.qop == ("auth", "auth-int")
    header = authorization(
        challenge,
        method="GET",
        uri="/dir/index.html",
        username="Mufasa",
        password="Circle of Life",
        cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
        nc=1,
    )
    creds = parse_credentials(header)
    assert creds.response == expected
    assert creds.algorithm == algorithm and creds.opaque == "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"


def test_legacy_rfc2069_response_without_qop() -> None:
    challenge = parse_challenge('Digest realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093"')
    header = authorization(
        challenge, method="GET", uri="/dir/index.html", username="Mufasa", password="Circle Of Life", cnonce="x", nc=1
    )
    creds = parse_credentials(header)
    assert creds.response == "670fd8c2df070c60b045671b8b24ff02"
    assert (creds.qop, creds.nc, creds.cnonce) == (None, None, None)
    assert "qop" not in header and "nc=" not in header and "cnonce" not in header


def test_stored_ha1_gives_the_same_response_as_the_password() -> None:
    stored = ha1_of("MD5", "Mufasa", "testrealm@host.com", "Circle Of Life")
    common = {
        "username": "Mufasa",
        "realm": "testrealm@host.com",
        "method": "GET",
        "uri": "/dir/index.html",
        "nonce": "dcd98b7102dd2f0e8b11d0f600bfb0c093",
        "qop": "auth",
        "nc": "00000001",
        "cnonce": "0a4f113b",
    }
    assert compute_response(algorithm="MD5", secret=stored, **common) == "6629fae49393a05397450978507c4ef1"
    # An HA1 stored for MD5 cannot answer a SHA-256 challenge.
    assert compute_response(algorithm="SHA-256", secret=stored, **common) is None


# -------------------------------------------------------------------------------- client/server round trip


def answer(
    header: str, *, username: str = "alice", password: str = "wonderland", nc: int = 1, method: str = "INVITE"
) -> str:
    return authorization(
        parse_challenge(header),
        method=method,
        uri="sip:agent@gw.example.com",
        username=username,
        password=password,
        cnonce=f"cn{nc}",
        nc=nc,
    )


def test_round_trip_md5_and_sha256() -> None:
    server = challenger(algorithms=("SHA-256", "MD5"))
    sha_header, md5_header = server.challenges(T0, salt=SALT)
    assert "algorithm=SHA-256" in sha_header and "algorithm=MD5" in md5_header and 'qop="auth"' in md5_header
    assert select_challenge([md5_header, sha_header]).algorithm == "SHA-256"
    for header in (sha_header, md5_header):
        verdict = server.verify("INVITE", answer(header), T0 + 1, uri="sip:agent@gw.example.com")
        assert verdict.ok and verdict.outcome is DigestOutcome.OK and verdict.username == "alice"


def test_round_trip_with_quotes_and_commas_in_password_and_username_escapes() -> None:
    server = challenger()
    header = server.challenge(T0, salt=SALT)
    assert server.verify(
        "REGISTER", answer(header, username="bob", password=PASSWORDS["bob"], method="REGISTER"), T0
    ).ok


def test_round_trip_stored_ha1_and_sess_variants() -> None:
    stored = {"carol": ha1_of("SHA-256", "carol", "gw.example.com", "s3cret")}
    server = challenger(credentials=stored.get, algorithms=("SHA-256-sess", "SHA-256"))
    for header in server.challenges(T0, salt=SALT):
        assert server.verify("INVITE", answer(header, username="carol", password="s3cret"), T0 + 2).ok


def test_legacy_no_qop_server() -> None:
    server = challenger(legacy_no_qop=True)
    header = server.challenge(T0, salt=SALT)
    assert "qop" not in header
    assert server.verify("INVITE", answer(header), T0 + 1).ok
    # The default server insists on qop=auth: a legacy answer to a legacy challenge is refused.
    strict = challenger()
    verdict = strict.verify("INVITE", answer(header), T0 + 1)
    assert verdict.outcome is DigestOutcome.MALFORMED and "qop=auth is required" in verdict.reason


def test_wrong_password_unknown_user_and_wrong_method() -> None:
    server = challenger()
    header = server.challenge(T0, salt=SALT)
    for creds, method in [(answer(header, password="nope"), "INVITE"), (answer(header, username="mallory"), "INVITE")]:
        verdict = server.verify(method, creds, T0 + 1)
        assert verdict.outcome is DigestOutcome.BAD_CREDENTIALS and verdict.reason == "wrong credentials"
    # A response computed for INVITE does not authorize a BYE.
    assert server.verify("BYE", answer(header, nc=2), T0 + 1).outcome is DigestOutcome.BAD_CREDENTIALS


def test_stale_nonce_only_when_the_digest_was_right() -> None:
    server = challenger(nonce_ttl_s=60)
    header = server.challenge(T0, salt=SALT)
    assert server.verify("INVITE", answer(header), T0 + 60).ok
    stale = server.verify("INVITE", answer(header, nc=2), T0 + 60.5)
    assert stale.outcome is DigestOutcome.STALE and stale.username == "alice"
    wrong = server.verify("INVITE", answer(header, password="nope", nc=3), T0 + 60.5)
    assert wrong.outcome is DigestOutcome.BAD_CREDENTIALS
    fresh = server.challenge(T0 + 60.5, salt=salt(2), stale=True)
    assert parse_challenge(fresh).stale
    assert server.verify("INVITE", answer(fresh), T0 + 61).ok


def test_nonce_from_the_future_beyond_skew_is_stale() -> None:
    server = challenger()
    header = server.challenge(T0 + 10, salt=SALT)
    assert server.verify("INVITE", answer(header), T0 + 9).ok  # within the tolerated skew
    assert server.verify("INVITE", answer(header, nc=2), T0).outcome is DigestOutcome.STALE


def test_tampered_or_foreign_nonce() -> None:
    server = challenger()
    nonce = parse_challenge(server.challenge(T0, salt=SALT)).nonce
    raw = bytearray(base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4)))
    raw[7] ^= 0x01  # move the timestamp by a millisecond: the MAC no longer matches
    tampered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    other_realm = parse_challenge(challenger(realm="other").challenge(T0, salt=SALT)).nonce
    other_secret = parse_challenge(challenger(nonce_secret=b"another-secret-of-16+").challenge(T0, salt=SALT)).nonce
    for bad in (tampered, other_realm, other_secret, "dcd98b7102dd2f0e8b11d0f600bfb0c093", "!!", "a" * 300):
        forged = DigestChallenge(realm="gw.example.com", nonce=bad, qop=("auth",)).to_header_value()
        verdict = server.verify("INVITE", answer(forged), T0 + 1)
        assert verdict.outcome is DigestOutcome.BAD_CREDENTIALS and verdict.reason == "nonce was not issued here"
    assert server.read_nonce(nonce) == (T0, "MD5")


def test_replayed_nonce_count_is_refused_but_reordering_passes() -> None:
    server = challenger()
    header = server.challenge(T0, salt=SALT)
    assert server.verify("INVITE", answer(header, nc=1), T0).ok
    replay = server.verify("INVITE", answer(header, nc=1), T0 + 1)
    assert replay.outcome is DigestOutcome.BAD_CREDENTIALS and "replayed" in replay.reason
    assert server.verify("INVITE", answer(header, nc=5), T0 + 1).ok
    assert server.verify("INVITE", answer(header, nc=3), T0 + 1).ok  # arrived late over UDP: still fresh
    assert not server.verify("INVITE", answer(header, nc=3), T0 + 1).ok
    assert not server.verify("INVITE", answer(header, nc=5), T0 + 1).ok
    assert server.verify("INVITE", answer(header, nc=200), T0 + 1).ok
    assert not server.verify("INVITE", answer(header, nc=100), T0 + 1).ok  # below the 64-count window


def test_nc_zero_is_malformed() -> None:
    server = challenger()
    header = server.challenge(T0, salt=SALT)
    creds = parse_credentials(answer(header))
    zero = dataclasses.replace(creds, nc="00000000")
    verdict = server.verify("INVITE", zero.to_header_value(), T0)
    assert verdict.outcome is DigestOutcome.MALFORMED and "nc counts from 00000001" in verdict.reason


def test_replay_memory_is_bounded_and_evicted_nonces_go_stale() -> None:
    server = challenger(max_tracked_nonces=3)
    headers = [server.challenge(T0 + i, salt=salt(i)) for i in range(5)]
    for i, header in enumerate(headers[:4]):
        assert server.verify("INVITE", answer(header), T0 + i + 0.5).ok
    assert server.tracked_nonces == 3
    # The first nonce was evicted: replaying it is not accepted, the client is sent for a fresh nonce.
    assert server.verify("INVITE", answer(headers[0]), T0 + 10).outcome is DigestOutcome.STALE
    assert server.verify("INVITE", answer(headers[0], nc=2), T0 + 10).outcome is DigestOutcome.STALE
    # A nonce issued after everything evicted is still fine.
    assert server.verify("INVITE", answer(headers[4]), T0 + 10).ok
    assert server.tracked_nonces == 3


def test_realm_algorithm_and_uri_mismatches() -> None:
    server = challenger(algorithms=("SHA-256",))
    nonce = parse_challenge(server.challenge(T0, salt=SALT)).nonce
    md5 = DigestChallenge(realm="gw.example.com", nonce=nonce, qop=("auth",)).to_header_value()
    assert server.verify("INVITE", answer(md5), T0).reason == "algorithm MD5 was not offered"
    wrong_realm = DigestChallenge(realm="elsewhere", nonce=nonce, algorithm="SHA-256", qop=("auth",))
    assert server.verify("INVITE", answer(wrong_realm.to_header_value()), T0).reason == "realm does not match"
    sha = server.challenge(T0, salt=SALT)
    verdict = server.verify("INVITE", answer(sha), T0, uri="sip:other@gw.example.com")
    assert verdict.outcome is DigestOutcome.BAD_CREDENTIALS and "request-URI" in verdict.reason


def test_configuration_is_validated() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        challenger(nonce_secret=b"short")
    with pytest.raises(ValueError, match="algorithms"):
        challenger(algorithms=("SHA-512",))
    with pytest.raises(ValueError, match="salt"):
        challenger().challenge(T0, salt=b"1234")
    with pytest.raises(ValueError, match="not configured"):
        challenger().challenge(T0, salt=SALT, algorithm="SHA-256")
    with pytest.raises(ValueError, match="nc"):
        answer(challenger().challenge(T0, salt=SALT), nc=0)


# -------------------------------------------------------------------------------------------- parsing


def test_quoted_strings_with_escapes_and_commas() -> None:
    scheme, params = parse_auth_params(
        'Digest realm="a, \\"quoted\\" realm", nonce=abc , ,opaque="x\\\\y",QOP="auth,auth-int"'
    )
    assert scheme == "Digest"
    assert params == {"realm": 'a, "quoted" realm', "nonce": "abc", "opaque": "x\\y", "qop": "auth,auth-int"}
    round_trip = parse_challenge(DigestChallenge(realm='a, "q" \\ r', nonce="n").to_header_value())
    assert round_trip.realm == 'a, "q" \\ r'


def test_challenge_details() -> None:
    challenge = parse_challenge('digest REALM="r", nonce="n", stale=TRUE, algorithm=sha-256, domain="sip:a sip:b"')
    assert challenge == DigestChallenge(realm="r", nonce="n", algorithm="SHA-256", stale=True, domain="sip:a sip:b")
    assert parse_challenge(challenge.to_header_value()) == challenge
    only_int = parse_challenge('Digest realm="r", nonce="n", qop="auth-int"')
    with pytest.raises(DigestError, match="unsupported qop"):
        authorization(only_int, method="INVITE", uri="sip:x", username="u", password="p", cnonce="c", nc=1)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("", "expected an auth scheme"),
        ('Basic realm="r"', "unsupported auth scheme"),
        ('Digest realm="r"', "missing nonce"),
        ('Digest nonce="n"', "missing realm"),
        ('Digest realm="r", nonce="n", algorithm=SHA-512', "unsupported algorithm"),
        ('Digest realm="r", nonce="n", stale=maybe', "bad stale value"),
        ('Digest realm="r", realm="s", nonce="n"', "duplicate parameter 'realm'"),
        ('Digest realm="r, nonce="n"', "expected ','"),
        ('Digest realm="unterminated', "unterminated quoted string"),
        ('Digest realm="r\\', "dangling backslash"),
        ("Digest realm", "has no '='"),
        ("Digest realm=", "empty value"),
        ('Digest realm="r" nonce="n"', "expected ','"),
        ('Digest =x, realm="r"', "expected a parameter name"),
        ('Digest realm="r", nonce="n\x00"', "control character"),
        ('Digest realm="' + "x" * 9000 + '"', "longer than"),
        ('Digest"realm="r"', "expected an auth scheme"),
    ],
)
def test_malformed_challenges(header: str, message: str) -> None:
    with pytest.raises(DigestError, match=message) as info:
        parse_challenge(header)
    assert isinstance(info.value, RemoteProtocolError) and info.value.status_code == 400


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ('Digest username="u", realm="r", nonce="n", uri="u", response="zz"', "not a MD5 hex digest"),
        ('Digest realm="r", nonce="n", uri="u", response="' + "0" * 32 + '"', "missing username"),
        (
            'Digest username="u", realm="r", nonce="n", uri="u", qop=auth, cnonce="c", response="' + "0" * 32 + '"',
            "missing nc",
        ),
        (
            'Digest username="u", realm="r", nonce="n", uri="u", qop=auth, nc=1, cnonce="c", response="'
            + "0" * 32
            + '"',
            "nc must be 8 hex digits",
        ),
        (
            'Digest username="u", realm="r", nonce="n", uri="u", algorithm=SHA-256, response="' + "0" * 32 + '"',
            "SHA-256",
        ),
    ],
)
def test_malformed_credentials_are_verdicts_not_exceptions(header: str, message: str) -> None:
    with pytest.raises(DigestError, match=message):
        parse_credentials(header)
    verdict = challenger().verify("INVITE", header, T0)
    assert verdict.outcome is DigestOutcome.MALFORMED and message in verdict.reason and not verdict.ok


_PIECES = st.sampled_from(
    ["Digest", " ", ",", "=", '"', "\\", "realm", "nonce", "qop", "auth", "username", "uri", "response", "nc",
     "cnonce", "algorithm", "MD5", "SHA-256", "stale", "true", "00000001", "0" * 32, "\r\n ", "\t", "\x00"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40))
def test_fuzz_parsers_raise_only_digest_error(pieces: list[str]) -> None:
    text = "".join(pieces)
    for parse in (parse_challenge, parse_credentials):
        try:
            parsed = parse(text)
        except DigestError:
            continue
        # Anything accepted must be re-serializable to something that parses back to the same value.
        assert parse(parsed.to_header_value()) == parsed
    verdict = challenger().verify("INVITE", text, T0)
    assert verdict.outcome in (DigestOutcome.MALFORMED, DigestOutcome.BAD_CREDENTIALS)


@settings(max_examples=200, deadline=None)
@given(
    username=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s and s.isprintable()),
    password=st.text(max_size=20),
    nc=st.integers(min_value=1, max_value=0xFFFFFFFF),
    algorithm=st.sampled_from(ALGORITHMS),
)
def test_property_any_user_round_trips(username: str, password: str, nc: int, algorithm: Algorithm) -> None:
    server = DigestChallenger(
        realm="gw",
        credentials={username: password}.get,
        nonce_secret=SECRET,
        algorithms=(algorithm,),
    )
    header = authorization(
        parse_challenge(server.challenge(T0, salt=SALT)),
        method="INVITE",
        uri="sip:a@b",
        username=username,
        password=password,
        cnonce="abc",
        nc=nc,
    )
    assert server.verify("INVITE", header, T0 + 1).ok
    assert server.verify("INVITE", header, T0 + 1).outcome is DigestOutcome.BAD_CREDENTIALS  # the replay


# ------------------------------------------------------------------- through the SIP core (sip/auth.py)


def test_in_memory_call_through_the_sip_core_with_digest_and_sdp() -> None:
    """Caller and gateway cores under a fake clock: 401, retry with credentials, SDP negotiated both ways."""
    net = Net()
    caller = net.add(5061)
    server = challenger(realm="127.0.0.1", credentials={"alice": "wonderland"}.get)
    authenticator = DigestAuthenticator(server, rng=random.Random(1))
    gateway = net.add(5062, authenticator=authenticator)
    offer = build_offer(local_address="127.0.0.1", local_port=4000, session_id=1, session_version=1)
    client = DigestClientCredentials(username="alice", password="wonderland", rng=random.Random(2))
    caller.invite(
        "sip:agent@127.0.0.1:5062",
        net.now,
        from_uri="<sip:alice@127.0.0.1:5061>",
        body=offer.to_bytes(),
        credentials=client,
    )
    offered = [event for event in net.events(gateway) if isinstance(event, CallOffered)]
    assert len(offered) == 1, net.lines()
    assert net.lines()[:4] == [
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
        "SIP/2.0 401 Unauthorized",
        "ACK sip:agent@127.0.0.1:5062 SIP/2.0",
        "INVITE sip:agent@127.0.0.1:5062 SIP/2.0",
    ]
    assert server.tracked_nonces == 1  # the retry's nc=1 was recorded: a replay of it would be refused
    remote_offer = parse_sdp(offered[0].body)
    negotiated = negotiate(remote_offer, local=LocalMedia())
    assert (negotiated.codec_name, negotiated.remote_rtp) == ("PCMU", ("127.0.0.1", 4000))
    answer_sdp = build_answer(
        remote_offer, negotiated, local_address="127.0.0.1", local_port=5000, session_id=2, session_version=1
    )
    gateway.answer(offered[0].call, net.now, body=answer_sdp.to_bytes())
    net.pump()
    answered = [event for event in net.events(caller) if isinstance(event, OutboundCallAnswered)]
    assert len(answered) == 1
    assert answered[0].body is not None
    ours = negotiate(parse_sdp(answered[0].body), local=LocalMedia())
    assert (ours.codec_name, ours.payload_type, ours.remote_rtp) == ("PCMU", 0, ("127.0.0.1", 5000))
    assert ours.telephone_event_payload_type == 101
