"""Trunks by source address (gateway/sip/trunk_auth.py) and the inbound policy's use of them, sans-I/O: a new
call from trunk A's network answers A's credentials (B's are wrong there), a trusted trunk is not challenged, a
source of no trunk gets the global credential or 403, and calls in progress are never re-checked."""

from __future__ import annotations

import random

from gateway.sip.auth import DigestAuthenticator
from gateway.sip.config import SipConfig
from gateway.sip.digest import DigestChallenger, authorization, parse_challenge
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import AuthenticationFailed, CallOffered
from gateway.sip.lockout import LockoutConfig
from gateway.sip.message import SipResponse, parse_message
from gateway.sip.trunk_auth import SourceTrunks, TrunkSource

URI = "sip:+15550199@127.0.0.1:5062"


def _authenticator(credentials: dict[str, str]) -> DigestAuthenticator:
    return DigestAuthenticator(
        DigestChallenger(realm="gw", credentials=credentials.get, nonce_secret=b"k" * 32), rng=random.Random(1)
    )


def _trunks(*, reject_unmatched: bool = False) -> SourceTrunks:
    return SourceTrunks(
        (
            TrunkSource(name="a", networks=("127.0.0.0/24",), authenticator=_authenticator({"carrier-a": "pw-a"})),
            TrunkSource(name="b", networks=("127.0.1.0/24",), authenticator=_authenticator({"carrier-b": "pw-b"})),
            TrunkSource(name="pbx", networks=("10.1.0.0/16",)),  # trusted by address: no challenge
            TrunkSource(name="pbx-edge", networks=("10.1.2.0/24",), authenticator=_authenticator({"edge": "pw-e"})),
        ),
        reject_unmatched=reject_unmatched,
    )


def gateway(
    *, trunks: SourceTrunks, global_credentials: dict[str, str] | None = None, lockout: bool = False
) -> SipEndpoint:
    config = SipConfig(
        local_port=5062,
        authenticator=_authenticator(global_credentials) if global_credentials else None,
        trunks=trunks,
        lockout=LockoutConfig(max_failures=100) if lockout else None,
        rate_limit=None,
    )
    return SipEndpoint(config, rng=random.Random(7))


class Caller:
    """INVITEs from one source, answering a 401 as ``user``/``password``."""

    def __init__(self, ep: SipEndpoint, host: str) -> None:
        self.ep, self.source, self.n = ep, (host, 5070), 0

    def invite(self, *, auth: str = "", to_tag: str = "") -> SipResponse | None:
        self.n += 1
        lines = [
            f"INVITE {URI} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.source[0]}:5070;branch=z9hG4bK{self.source[0]}-{self.n};rport",
            "Max-Forwards: 70",
            f"From: <sip:+15550100@{self.source[0]}>;tag=f{self.n}",
            f"To: <{URI}>" + (f";tag={to_tag}" if to_tag else ""),
            f"Call-ID: call-{self.source[0]}-{self.n}",
            "CSeq: 1 INVITE",
            f"Contact: <sip:+15550100@{self.source[0]}:5070>",
        ]
        if auth:
            lines.append(f"Authorization: {auth}")
        self.ep.receive(
            ("\r\n".join(lines) + "\r\nContent-Length: 0\r\n\r\n").encode(), self.source, transport="udp", now=1.0
        )
        out = [o for o in self.ep.datagrams() if o.destination[0] == self.source[0]]
        if not out:
            return None
        message = parse_message(out[-1].data)
        assert isinstance(message, SipResponse)
        return message

    def attempt(self, user: str, password: str) -> SipResponse | None:
        challenge = self.invite()
        assert challenge is not None and challenge.status == 401, challenge
        answer = authorization(
            parse_challenge(challenge.headers.get("WWW-Authenticate") or ""),
            method="INVITE",
            uri=URI,
            username=user,
            password=password,
            cnonce=f"cn{self.n}",
            nc=1,
        )
        return self.invite(auth=answer)


def _offered(ep: SipEndpoint) -> list[CallOffered]:
    return [event for event in ep.events() if isinstance(event, CallOffered)]


def test_the_most_specific_network_picks_the_trunk() -> None:
    trunks = _trunks()
    assert [trunks.trunk_of(host).name for host in ("127.0.0.2", "127.0.1.9", "10.1.7.7", "10.1.2.3")] == [  # type: ignore[union-attr]
        "a",
        "b",
        "pbx",
        "pbx-edge",
    ]
    assert trunks.trunk_of("192.0.2.1") is None and trunks.trunk_of("::1") is None
    assert trunks.trunk_of("not an address") is None


def test_a_call_from_a_trunk_answers_that_trunks_credentials_and_not_another_trunks() -> None:
    ep = gateway(trunks=_trunks(), lockout=True)
    a = Caller(ep, "127.0.0.2")
    ok = a.attempt("carrier-a", "pw-a")
    assert ok is None or ok.status != 401  # no response yet: the call is offered to the application
    assert len(_offered(ep)) == 1
    wrong = a.attempt("carrier-b", "pw-b")  # the right password, of the other trunk
    assert wrong is not None and wrong.status == 401
    events = ep.events()
    assert [e.username for e in events if isinstance(e, AuthenticationFailed)] == ["carrier-b"]
    assert not [e for e in events if isinstance(e, CallOffered)]
    b = Caller(ep, "127.0.1.5")
    b.attempt("carrier-b", "pw-b")
    assert len(_offered(ep)) == 1
    assert b.attempt("carrier-a", "pw-a").status == 401  # type: ignore[union-attr]


def test_a_trusted_trunk_is_not_challenged_and_in_dialog_requests_never_are() -> None:
    ep = gateway(trunks=_trunks(), global_credentials={"alice": "wonderland"})
    Caller(ep, "10.1.9.9").invite()
    assert len(_offered(ep)) == 1
    response = Caller(ep, "127.0.0.3").invite(to_tag="t1")  # in a dialog: the edge never cuts it
    assert response is None or response.status != 401


def test_a_source_of_no_trunk_gets_the_global_credential_or_403() -> None:
    ep = gateway(trunks=_trunks(), global_credentials={"alice": "wonderland"})
    stranger = Caller(ep, "192.0.2.7")
    assert stranger.attempt("carrier-a", "pw-a").status == 401  # type: ignore[union-attr]
    stranger.attempt("alice", "wonderland")
    assert len(_offered(ep)) == 1

    open_ep = gateway(trunks=_trunks())  # no global credential: not challenged, as without trunks
    Caller(open_ep, "192.0.2.7").invite()
    assert len(_offered(open_ep)) == 1

    closed = gateway(trunks=_trunks(reject_unmatched=True), global_credentials={"alice": "wonderland"})
    refused = Caller(closed, "192.0.2.7").invite()
    assert refused is not None and refused.status == 403 and not _offered(closed)
    Caller(closed, "10.1.0.1").invite()  # a trunk's source is still taken
    assert len(_offered(closed)) == 1
