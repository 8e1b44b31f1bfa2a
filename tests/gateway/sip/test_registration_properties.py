"""Property tests of the registration state table: whatever a registrar answers, and whenever the stop comes,
the client keeps RFC 3261 §10.2's rules and its own bounds."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import TrunkRegistered, TrunkRegistrationFailed, TrunkUnregistered
from gateway.sip.message import SipRequest, make_response, parse_message
from gateway.sip.registration import RegistrationConfig, RegistrationTiming, RegState

GW, REG = ("127.0.0.1", 5070), ("127.0.0.1", 5090)
TIMER_F = 32.0
BEHAVIOURS = ("ok", "ok_unlisted", "challenge", "stale", "too_brief", "forbidden", "unavailable", "silent")


class ScriptedRegistrar:
    """Answers each new REGISTER (by CSeq) with the next scripted behaviour; retransmissions get the same."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.answers: dict[int, bytes | None] = {}
        self.first_seen: dict[int, float] = {}
        self.final_at: dict[int, float] = {}
        self.requests: list[tuple[float, SipRequest]] = []

    def handle(self, data: bytes, now: float) -> bytes | None:
        request = parse_message(data)
        assert isinstance(request, SipRequest)
        self.requests.append((now, request))
        cseq = request.cseq.number
        if cseq not in self.answers:
            self.first_seen[cseq] = now
            behaviour = self.script.pop(0) if self.script else "ok"
            self.answers[cseq] = self._answer(request, behaviour)
            if self.answers[cseq] is not None:
                self.final_at[cseq] = now
        return self.answers[cseq]

    @staticmethod
    def _answer(request: SipRequest, behaviour: str) -> bytes | None:
        contact = request.headers.get("Contact") or ""
        expires = request.headers.get("Expires") or "3600"
        headers: tuple[tuple[str, str], ...]
        if behaviour == "silent":
            return None
        if behaviour in ("challenge", "stale"):
            stale = ", stale=true" if behaviour == "stale" else ""
            value = f'Digest realm="r", nonce="n{random.random()}", qop="auth"{stale}'
            return make_response(request, 401, to_tag="t", headers=(("WWW-Authenticate", value),)).encode()
        if behaviour == "too_brief":
            headers = (("Min-Expires", str(int(expires) * 2 + 1)),)
            return make_response(request, 423, to_tag="t", headers=headers).encode()
        if behaviour == "forbidden":
            return make_response(request, 403, to_tag="t").encode()
        if behaviour == "unavailable":
            return make_response(request, 503, to_tag="t", headers=(("Retry-After", "40"),)).encode()
        if expires == "0":
            headers = ()
        elif behaviour == "ok_unlisted":
            headers = (("Expires", "300"),)
        else:
            headers = (("Contact", f"{contact};expires={min(int(expires), 300)}"),)
        return make_response(request, 200, to_tag="t", headers=headers).encode()


@settings(max_examples=150, deadline=None)
@given(
    script=st.lists(st.sampled_from(BEHAVIOURS), max_size=25),
    stop_after=st.floats(min_value=0.0, max_value=2000.0),
    within=st.floats(min_value=0.5, max_value=40.0),
)
def test_any_registrar_any_stop(script: list[str], stop_after: float, within: float) -> None:
    registrar = ScriptedRegistrar(script)
    endpoint = SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(5))
    now = 0.0
    events: list[tuple[float, object]] = []

    def pump() -> None:
        for _ in range(1000):
            events.extend((now, event) for event in endpoint.events())
            out = endpoint.datagrams()
            if not out:
                return
            for datagram in out:
                assert datagram.destination == REG
                answer = registrar.handle(datagram.data, now)
                if answer is not None:
                    endpoint.receive(answer, REG, transport="udp", now=now)
        raise AssertionError("no quiet")

    def run_until(until: float) -> None:
        nonlocal now
        pump()
        while (deadline := endpoint.next_deadline()) is not None and deadline <= until:
            now = max(now, deadline)
            endpoint.handle_timers(now)
            pump()
        now = until

    config = RegistrationConfig(
        registrar="sip:127.0.0.1:5090",
        aor="sip:gw@carrier.test",
        username="u",
        password="p",
        expires=60,
        timing=RegistrationTiming(retry_min_s=2, retry_max_s=30, retry_after_max_s=60),
    )
    client = endpoint.registrations.add(config, now)
    run_until(stop_after)
    stopped_at = now
    endpoint.registrations.stop(client, now, within=within)
    run_until(stopped_at + within + 100)

    assert endpoint.stats.internal_errors == 0
    requests = [request for _, request in registrar.requests]
    assert {r.call_id for r in requests} == {requests[0].call_id}
    assert {r.from_.tag for r in requests} == {requests[0].from_.tag}
    distinct = sorted(registrar.first_seen)
    assert distinct == list(range(1, len(distinct) + 1))  # CSeq + 1 for every new request, none skipped
    for previous, current in itertools.pairwise(distinct):
        # §10.2: a new REGISTER only after the previous one's final response or its timeout.
        answered = registrar.final_at.get(previous)
        started = registrar.first_seen[current]
        assert (answered is not None and answered <= started) or started >= registrar.first_seen[previous] + TIMER_F
    removals = [cseq for cseq in distinct if _expires(registrar, cseq) == "0"]
    assert all(registrar.first_seen[cseq] >= stopped_at for cseq in removals)
    done = [(t, e) for t, e in events if isinstance(e, TrunkUnregistered)]
    assert len(done) == 1 and done[0][0] <= stopped_at + within
    assert client.state is RegState.STOPPED and endpoint.registrations.clients == []
    assert all(first <= done[0][0] for first in registrar.first_seen.values())  # nothing new after the end
    for t, event in events:
        if isinstance(event, TrunkRegistrationFailed):
            assert 0 < event.retry_in <= 60
        if isinstance(event, TrunkRegistered):
            assert t <= stopped_at  # a grant that answers after the stop is removed, never reported


def _expires(registrar: ScriptedRegistrar, cseq: int) -> str | None:
    for _, request in registrar.requests:
        if request.cseq.number == cseq:
            return request.headers.get("Expires")
    return None
