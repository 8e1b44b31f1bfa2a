"""The lockout table (gateway/sip/lockout.py) and the edge it gives the endpoint: password guessing from one
source is blocked and silenced, the block grows on repeat, a username guessed from many sources is refused,
other sources and calls in progress are unaffected, scanners are dropped, and the Server header can be off."""

from __future__ import annotations

import random

import pytest

from gateway.sip.auth import DigestAuthenticator
from gateway.sip.config import SipConfig
from gateway.sip.digest import DigestChallenger, authorization, parse_challenge
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import SipConfigError
from gateway.sip.events import AuthenticationFailed, CallOffered, SourceBlocked
from gateway.sip.lockout import AuthLockout, LockoutConfig
from gateway.sip.message import SipResponse, parse_message

URI = "sip:agent@127.0.0.1:5062"


def test_source_blocked_after_max_failures_within_window() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=3, window_s=10, block_s=30, max_block_s=120))
    assert lockout.failed("10.0.0.1", "alice", 0.0) == []
    assert lockout.failed("10.0.0.1", "alice", 1.0) == []
    (blocked,) = lockout.failed("10.0.0.1", "alice", 2.0)
    assert (blocked.scope, blocked.key, blocked.failures, blocked.block_s) == ("source", "10.0.0.1", 3, 30)
    assert lockout.source_blocked("10.0.0.1", 31.9)
    assert not lockout.source_blocked("10.0.0.1", 32.0)
    assert not lockout.source_blocked("10.0.0.2", 5.0)


def test_failures_outside_the_window_do_not_add_up() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=3, window_s=10))
    for t in (0.0, 6.0, 12.0, 18.0, 24.0):
        assert lockout.failed("10.0.0.1", None, t) == []
    assert not lockout.source_blocked("10.0.0.1", 24.0)


def test_block_doubles_on_repeat_up_to_the_maximum() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=2, window_s=5, block_s=10, max_block_s=25))
    lengths = []
    now = 0.0
    for _ in range(4):
        lockout.failed("10.0.0.1", None, now)
        (blocked,) = lockout.failed("10.0.0.1", None, now + 0.1)
        lengths.append(blocked.block_s)
        now = blocked.until + 0.1
    assert lengths == [10, 20, 25, 25]


def test_a_right_answer_resets_the_count_not_the_history() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=3, window_s=60))
    lockout.failed("10.0.0.1", None, 0.0)
    lockout.failed("10.0.0.1", None, 1.0)
    lockout.succeeded("10.0.0.1")
    assert lockout.failed("10.0.0.1", None, 2.0) == []
    assert lockout.failed("10.0.0.1", None, 3.0) == []


def test_username_guessed_from_many_sources_is_blocked() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=100, user_max_failures=4, window_s=60, block_s=30))
    events = [lockout.failed(f"10.0.1.{i}", "alice", float(i)) for i in range(4)]
    assert events[:3] == [[], [], []]
    (blocked,) = events[3]
    assert (blocked.scope, blocked.key) == ("user", "alice")
    assert lockout.user_blocked("alice", 10.0) and not lockout.user_blocked("bob", 10.0)


def test_never_block_sources_are_never_blocked() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=1, never_block=("10.9.0.0/16",)))
    assert lockout.failed("10.9.3.4", None, 0.0) == []
    assert not lockout.source_blocked("10.9.3.4", 0.5)


def test_memory_is_bounded() -> None:
    lockout = AuthLockout(LockoutConfig(max_failures=5, max_entries=10))
    for i in range(1000):
        lockout.failed(f"10.{i // 250}.{i % 250}.1", f"user{i}", 0.0)
    assert len(lockout._sources) == 10 and len(lockout._users) == 10


@pytest.mark.parametrize(
    "bad", [{"max_failures": 0}, {"window_s": 0}, {"block_s": 10, "max_block_s": 5}, {"never_block": ("x/99",)}]
)
def test_bad_config_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(SipConfigError):
        LockoutConfig(**bad)  # type: ignore[arg-type]


# --- the endpoint's edge ------------------------------------------------------------------------------


def gateway(**config: object) -> SipEndpoint:
    challenger = DigestChallenger(realm="gw", credentials={"alice": "wonderland"}.get, nonce_secret=b"k" * 32)
    sip = SipConfig(
        local_port=5062,
        authenticator=DigestAuthenticator(challenger, rng=random.Random(1)),
        **config,  # type: ignore[arg-type]
    )
    return SipEndpoint(sip, rng=random.Random(7))


class Caller:
    """One source sending INVITEs (each a new call) and answering the 401 with a password."""

    def __init__(self, ep: SipEndpoint, host: str, *, user_agent: str = "baresip") -> None:
        self.ep, self.source, self.user_agent, self.n = ep, (host, 5070), user_agent, 0

    def invite(self, now: float, *, auth: str = "", to_tag: str = "") -> SipResponse | None:
        self.n += 1
        lines = [
            f"INVITE {URI} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.source[0]}:5070;branch=z9hG4bK{self.source[0]}-{self.n};rport",
            "Max-Forwards: 70",
            f"From: <sip:alice@{self.source[0]}>;tag=f{self.n}",
            f"To: <{URI}>" + (f";tag={to_tag}" if to_tag else ""),
            f"Call-ID: call-{self.source[0]}-{self.n}",
            "CSeq: 1 INVITE",
            f"Contact: <sip:alice@{self.source[0]}:5070>",
            f"User-Agent: {self.user_agent}",
        ]
        if auth:
            lines.append(f"Authorization: {auth}")
        self.ep.receive(
            ("\r\n".join(lines) + "\r\nContent-Length: 0\r\n\r\n").encode(), self.source, transport="udp", now=now
        )
        out = [o for o in self.ep.datagrams() if o.destination[0] == self.source[0]]
        if not out:
            return None
        message = parse_message(out[-1].data)
        assert isinstance(message, SipResponse)
        return message

    def attempt(self, now: float, password: str) -> SipResponse | None:
        challenge = self.invite(now)
        assert challenge is not None and challenge.status == 401
        answer = authorization(
            parse_challenge(challenge.headers.get("WWW-Authenticate") or ""),
            method="INVITE",
            uri=URI,
            username="alice",
            password=password,
            cnonce=f"cn{self.n}",
            nc=1,
        )
        return self.invite(now, auth=answer)


def test_guessing_source_is_silenced_while_another_source_gets_in() -> None:
    ep = gateway(lockout=LockoutConfig(max_failures=5, window_s=60, block_s=60))
    attacker, caller = Caller(ep, "127.0.0.2"), Caller(ep, "127.0.0.3")
    answers = [attacker.attempt(1.0 + i * 0.01, f"guess{i}") for i in range(5)]
    assert [a.status if a else None for a in answers] == [401, 401, 401, 401, None]
    assert attacker.invite(2.0) is None  # blocked: not even challenged
    failed = [e for e in ep.events() if isinstance(e, AuthenticationFailed)]
    assert len(failed) == 5 and {e.username for e in failed} == {"alice"}
    stats = ep.stats
    assert (stats.auth_failed, stats.sources_blocked, stats.blocked_dropped) == (5, 1, 2)

    assert caller.attempt(2.0, "wonderland") is not None
    assert any(isinstance(e, CallOffered) for e in ep.events())


def test_the_block_ends_and_the_right_password_is_then_accepted() -> None:
    ep = gateway(lockout=LockoutConfig(max_failures=2, window_s=60, block_s=30))
    attacker = Caller(ep, "127.0.0.2")
    attacker.attempt(0.0, "x")
    attacker.attempt(0.1, "y")
    blocked = [e for e in ep.events() if isinstance(e, SourceBlocked)]
    assert [(b.scope, b.key, b.block_s) for b in blocked] == [("source", "127.0.0.2", 30)]
    assert attacker.invite(29.0) is None
    attacker.attempt(31.0, "wonderland")
    assert any(isinstance(e, CallOffered) for e in ep.events())


def test_in_dialog_requests_from_a_blocked_source_still_reach_their_call() -> None:
    ep = gateway(lockout=LockoutConfig(max_failures=1, window_s=60, block_s=60))
    attacker = Caller(ep, "127.0.0.2")
    attacker.attempt(0.0, "x")
    response = attacker.invite(1.0, to_tag="established")  # a re-INVITE of a dialog we do not know
    assert response is not None and response.status == 481


def test_never_block_source_keeps_being_challenged() -> None:
    ep = gateway(lockout=LockoutConfig(max_failures=1, never_block=("127.0.0.0/30",)))
    pbx = Caller(ep, "127.0.0.2")
    assert [getattr(pbx.attempt(float(i), "wrong"), "status", None) for i in range(3)] == [401, 401, 401]


def test_known_scanners_are_dropped_unanswered() -> None:
    ep = gateway(scanner_agents=("friendly-scanner", "sipvicious"))
    assert Caller(ep, "127.0.0.4", user_agent="friendly-scanner").invite(0.0) is None
    assert Caller(ep, "127.0.0.5", user_agent="SIPVicious 0.3.4").invite(0.0) is None
    assert ep.stats.scanner_dropped == 2
    response = Caller(ep, "127.0.0.6", user_agent="Zoiper").invite(0.0)
    assert response is not None and response.status == 401


def options_answer(user_agent: str) -> SipResponse:
    ep = SipEndpoint(SipConfig(local_port=5062, user_agent=user_agent), rng=random.Random(7))
    ep.receive(
        (
            f"OPTIONS {URI} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKo1\r\nMax-Forwards: 70\r\n"
            "From: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>\r\nCall-ID: o1\r\nCSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode(),
        ("127.0.0.1", 5070),
        transport="udp",
        now=0.0,
    )
    (out,) = ep.datagrams()
    response = parse_message(out.data)
    assert isinstance(response, SipResponse) and response.status == 200
    return response


def test_the_product_name_is_configurable_and_can_be_left_out() -> None:
    named = options_answer("pbx")
    assert named.headers.get("Server") == "pbx" and named.headers.get("User-Agent") is None
    anonymous = options_answer("")
    assert anonymous.headers.get("Server") is None and anonymous.headers.get("User-Agent") is None
