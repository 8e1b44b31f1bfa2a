"""The registration client (gateway/sip/registration.py) through a SipEndpoint against a fake registrar,
under a fake clock: every row of the state table, the digest, expiry and backoff rules, and removal."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gateway.sip.config import SipConfig
from gateway.sip.digest import parse_credentials
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import SipConfigError
from gateway.sip.events import TrunkRegistered, TrunkRegistrationFailed, TrunkUnregistered
from gateway.sip.message import SipRequest
from gateway.sip.registration import TABLE, RegInput, RegistrationConfig, RegistrationTiming, RegState
from gateway.sip.registration_replies import MAX_STALE_ANSWERS
from tests.gateway.sip.registrar import FakeRegistrar, Wire

GW = ("127.0.0.1", 5070)
REG = ("127.0.0.1", 5090)
AOR = "sip:+15550100@carrier.test"
INSTANCE = "urn:uuid:6f1f8e2a-9d1c-4b1e-8f43-2b9d7b3f0a11"
TIMER_F = 32.0  # 64 * T1 with the default T1


def config(**overrides: object) -> RegistrationConfig:
    options: dict[str, object] = {
        "registrar": "sip:127.0.0.1:5090",
        "aor": AOR,
        "username": "auth-user",
        "password": "secret",
        "expires": 3600,
        "instance_id": INSTANCE,
        "timing": RegistrationTiming(retry_min_s=4.0, retry_max_s=60.0, refresh_spread=0.0),  # refresh at half
    }
    options.update(overrides)
    return RegistrationConfig(**options)  # type: ignore[arg-type]


def setup(registrar: FakeRegistrar | None = None, **overrides: object):  # type: ignore[no-untyped-def]
    wire = Wire()
    endpoint = wire.add_endpoint(GW, SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(3)))
    registrar = registrar or FakeRegistrar()
    wire.registrars[REG] = registrar
    client = endpoint.registrations.add(config(**overrides), wire.now)
    wire.pump()
    return wire, endpoint, registrar, client


def cseqs(requests: list[SipRequest]) -> list[int]:
    """The distinct requests (retransmissions share their CSeq), in order."""
    seen: list[int] = []
    for request in requests:
        if not seen or seen[-1] != request.cseq.number:
            seen.append(request.cseq.number)
    return seen


def registered(wire: Wire) -> list[TrunkRegistered]:
    return wire.of_type(GW, TrunkRegistered)  # type: ignore[return-value]


def failed(wire: Wire) -> list[TrunkRegistrationFailed]:
    return wire.of_type(GW, TrunkRegistrationFailed)  # type: ignore[return-value]


def unregistered(wire: Wire) -> list[TrunkUnregistered]:
    return wire.of_type(GW, TrunkUnregistered)  # type: ignore[return-value]


# --- registering -------------------------------------------------------------------------------


def test_challenge_answered_once_then_bound_with_the_granted_expiry() -> None:
    wire, _endpoint, registrar, client = setup()
    first, second = registrar.requests
    assert first.headers.get("Authorization") is None
    assert [r.cseq.number for r in (first, second)] == [1, 2]
    assert first.call_id == second.call_id and first.from_.tag == second.from_.tag
    assert first.to.uri.user == "+15550100" and str(first.uri) == "sip:127.0.0.1:5090"
    assert first.headers.get("Expires") == "3600"
    contact = first.contacts[0]
    assert str(contact.uri) == "sip:gateway@127.0.0.1:5070" and contact.param("+sip.instance") == f"<{INSTANCE}>"
    credentials = parse_credentials(second.headers.get("Authorization") or "")
    assert credentials.username == "auth-user" and credentials.realm == "carrier.test"  # not the AOR's user
    assert credentials.uri == "sip:127.0.0.1:5090" and credentials.nc == "00000001"
    [event] = registered(wire)
    assert event.expires == 3600 and not event.refreshed and event.contact_listed and event.other_contacts == 0
    assert event.aor == AOR and event.registrar == "sip:127.0.0.1:5090"
    status = client.status()
    assert status.state is RegState.REGISTERED and client.registered
    assert status.expires_at == wire.now + 3600 and status.refresh_at == wire.now + 1800
    assert status.attempts == 0 and status.last_status == 200 and status.last_error == ""
    assert client.next_deadline() == wire.now + 1800  # (the endpoint also has Timer K until +5 s)
    assert [b.uri for b in registrar.contacts("+15550100", wire.now)] == ["sip:gateway@127.0.0.1:5070"]


def test_through_an_outbound_proxy_every_register_carries_its_route_and_goes_to_it() -> None:
    wire = Wire()
    # The registrar's name does not resolve: only the proxy (the fake registrar's address) is reachable.
    sip = SipConfig(local_port=GW[1], transports=("udp", "tcp"), outbound_proxy="sip:127.0.0.1:5090;transport=tcp")
    endpoint = wire.add_endpoint(GW, SipEndpoint(sip, rng=random.Random(3)))
    registrar = wire.registrars[REG] = FakeRegistrar(max_expires=90)
    client = endpoint.registrations.add(config(registrar="sip:carrier.invalid"), wire.now)
    wire.run_until(wire.now + 60)  # challenged, bound, refreshed once
    assert client.registered and cseqs(registrar.requests) == [1, 2, 3]
    for request in registrar.requests:
        assert str(request.uri) == "sip:carrier.invalid"
        assert request.headers.values("Route") == ["<sip:127.0.0.1:5090;transport=tcp;lr>"]
        assert request.top_via.transport == "TCP" and request.contacts[0].uri.transport == "tcp"
    assert {destination for _, destination, _ in wire.sent} == {REG}


def test_short_grant_is_refreshed_at_half_with_the_nonce_reused_and_cseq_growing() -> None:
    wire, _endpoint, registrar, client = setup(FakeRegistrar(max_expires=90))
    start = wire.now
    assert registered(wire)[0].expires == 90  # asked 3600, granted 90
    wire.run_until(start + 44.9)
    assert len(registrar.requests) == 2
    wire.run_until(start + 45)
    refresh = registrar.requests[2]
    assert refresh.cseq.number == 3 and refresh.call_id == registrar.requests[0].call_id
    assert parse_credentials(refresh.headers.get("Authorization") or "").nc == "00000002"  # one round trip
    assert len(registrar.requests) == 3
    second = registered(wire)[1]
    assert second.refreshed and second.expires == 90
    assert client.status().expires_at == start + 45 + 90
    wire.run_until(start + 45 + 45)  # and again, for ever
    assert cseqs(registrar.requests) == [1, 2, 3, 4] and len(registered(wire)) == 3
    assert registrar.contacts("+15550100", wire.now)


def test_grant_from_the_expires_header_when_the_contact_has_no_parameter() -> None:
    registrar = FakeRegistrar()
    registrar.forced.append((401, (("WWW-Authenticate", 'Digest realm="r", nonce="n1", qop="auth"'),)))
    registrar.forced.append((200, (("Contact", "<sip:gateway@127.0.0.1:5070>"), ("Expires", "120"))))
    wire, _, _, client = setup(registrar, instance_id=None)
    [event] = registered(wire)
    assert event.expires == 120 and event.contact_listed
    assert client.status().refresh_at == wire.now + 60


def test_contact_parameter_wins_over_the_header_and_garbage_falls_back_to_what_was_asked() -> None:
    registrar = FakeRegistrar(username=None)
    contact = f'<sip:gateway@127.0.0.1:5070>;expires=30;+sip.instance="<{INSTANCE}>"'
    registrar.forced.append((200, (("Contact", contact), ("Expires", "600"))))
    wire, _, _, client = setup(registrar, username=None, password=None)
    assert registered(wire)[0].expires == 30
    registrar.forced.append((200, (("Contact", "<sip:gateway@127.0.0.1:5070>;expires=soon"), ("Expires", "x"))))
    wire.advance(15)
    assert registered(wire)[1].expires == 3600  # nothing readable: what we asked
    assert client.state is RegState.REGISTERED


def test_200_without_our_contact_is_reported_and_taken_as_granted() -> None:
    registrar = FakeRegistrar(username=None, max_expires=600)
    registrar.list_contacts = False
    wire, _, _, client = setup(registrar, username=None, password=None)
    [event] = registered(wire)
    assert not event.contact_listed and event.expires == 3600  # no Contact, no Expires: what we asked
    assert client.registered


def test_a_2xx_granting_nothing_is_a_failure() -> None:
    registrar = FakeRegistrar(username=None)
    registrar.forced.append((200, (("Contact", "<sip:gateway@127.0.0.1:5070>;expires=0"),)))
    wire, _, _, client = setup(registrar, username=None, password=None, instance_id=None)
    [failure] = failed(wire)
    assert failure.status == 200 and "granted 0 s" in failure.reason and client.state is RegState.FAILED


def test_each_worker_finds_its_own_contact_among_the_aors_bindings() -> None:
    wire = Wire()
    registrar = FakeRegistrar()
    wire.registrars[REG] = registrar
    other = ("127.0.0.1", 5072)
    a = wire.add_endpoint(GW, SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(3)))
    b = wire.add_endpoint(other, SipEndpoint(SipConfig(local_port=other[1]), rng=random.Random(4)))
    client_a = a.registrations.add(config(), wire.now)
    client_b = b.registrations.add(config(instance_id="urn:uuid:00000000-0000-4000-8000-000000000002"), wire.now)
    wire.pump()
    assert client_a.contact != client_b.contact and client_a.call_id != client_b.call_id
    [event_b] = wire.of_type(other, TrunkRegistered)
    assert event_b.contact_listed and event_b.other_contacts == 1  # worker a's binding, listed too
    assert sorted(b.uri for b in registrar.contacts("+15550100", wire.now)) == [
        "sip:gateway@127.0.0.1:5070",
        "sip:gateway@127.0.0.1:5072",
    ]


# --- digest ------------------------------------------------------------------------------------


def test_stale_nonce_on_refresh_is_answered_with_the_new_nonce() -> None:
    wire, _, registrar, client = setup(FakeRegistrar(max_expires=600, nonce_ttl_s=100))
    wire.advance(300)  # the refresh reuses a nonce 300 s old: stale
    refresh, answer = registrar.requests[2:4]
    assert refresh.cseq.number == 3 and answer.cseq.number == 4
    old = parse_credentials(refresh.headers.get("Authorization") or "")
    new = parse_credentials(answer.headers.get("Authorization") or "")
    assert old.nonce != new.nonce and new.nc == "00000001"
    assert not failed(wire) and registered(wire)[-1].refreshed and client.registered


def test_wrong_password_fails_after_one_answer_naming_realm_and_user() -> None:
    wire, _, registrar, client = setup(password="not-the-password")
    assert cseqs(registrar.requests) == [1, 2]  # the challenge, one answer: no loop
    [failure] = failed(wire)
    assert failure.status == 401 and failure.outcome == "auth_rejected" and failure.failures == 1
    assert "'auth-user'" in failure.reason and "'carrier.test'" in failure.reason
    assert 2.0 <= failure.retry_in <= 4.0
    status = client.status()
    assert status.state is RegState.FAILED and status.last_status == 401 and status.last_error == failure.reason
    assert status.next_attempt_at == wire.now + failure.retry_in and status.attempts == 1
    wire.advance(failure.retry_in)
    assert cseqs(registrar.requests) == [1, 2, 3, 4]  # the retry: one stale-free answer with the new nonce
    assert client.status().attempts == 2 and len(failed(wire)) == 2


def test_wrong_username_is_refused_too() -> None:
    wire, _, _, _ = setup(username="someone-else")
    [failure] = failed(wire)
    assert failure.outcome == "auth_rejected" and "'someone-else'" in failure.reason


def test_a_challenge_without_credentials_configured_fails_with_a_clear_reason() -> None:
    wire, _, registrar, _ = setup(username=None, password=None)
    assert len(registrar.requests) == 1
    [failure] = failed(wire)
    assert failure.outcome == "auth_rejected" and "none are configured" in failure.reason


def test_endless_stale_challenges_are_bounded() -> None:
    registrar = FakeRegistrar()
    registrar.always_stale = True
    wire, _, _, _ = setup(registrar)
    assert cseqs(registrar.requests) == list(range(1, 3 + MAX_STALE_ANSWERS))
    [failure] = failed(wire)
    assert "stale again" in failure.reason


def test_unusable_challenges_fail_without_answering() -> None:
    registrar = FakeRegistrar()
    registrar.forced.append((401, (("WWW-Authenticate", "Basic realm=x"),)))
    wire, _, _, _ = setup(registrar)
    assert "cannot answer" in failed(wire)[0].reason
    registrar.forced.append((407, (("Proxy-Authenticate", 'Digest realm="p", nonce="n", qop="auth-int"'),)))
    wire.advance(4)
    assert "qop=auth-int" in failed(wire)[1].reason


def test_407_is_answered_with_proxy_authorization() -> None:
    registrar = FakeRegistrar(username=None)
    registrar.forced.append((407, (("Proxy-Authenticate", 'Digest realm="proxy.test", nonce="abc", qop="auth"'),)))
    _wire, _, _, client = setup(registrar)
    answer = registrar.requests[1]
    assert answer.headers.get("Authorization") is None
    assert parse_credentials(answer.headers.get("Proxy-Authorization") or "").realm == "proxy.test"
    assert client.registered


# --- 423, failures, backoff ----------------------------------------------------------------------


def test_423_is_answered_with_min_expires_which_later_refreshes_keep() -> None:
    wire, _, registrar, client = setup(FakeRegistrar(min_expires=120, max_expires=300), expires=60)
    assert [r.headers.get("Expires") for r in registrar.requests] == ["60", "60", "120"]
    assert registered(wire)[0].expires == 120
    wire.advance(60)
    assert registrar.requests[-1].headers.get("Expires") == "120" and len(registered(wire)) == 2
    assert client.expires_asked == 120


def test_423_without_a_longer_min_expires_fails() -> None:
    registrar = FakeRegistrar(username=None)
    registrar.forced.append((423, ()))
    wire, _, _, _ = setup(registrar)
    assert "no usable Min-Expires" in failed(wire)[0].reason
    registrar.forced.append((423, (("Min-Expires", "60"),)))
    wire.advance(4)
    assert "Min-Expires 60" in failed(wire)[1].reason


def test_no_response_is_a_timeout_after_timer_f_with_retransmissions_meanwhile() -> None:
    registrar = FakeRegistrar()
    registrar.silent = True
    wire, _, _, client = setup(registrar)
    start = wire.now
    wire.run_until(start + TIMER_F - 0.01)
    assert not failed(wire) and client.state is RegState.REGISTERING
    assert len(registrar.requests) > 5 and cseqs(registrar.requests) == [1]  # retransmitted, never re-sent new
    wire.run_until(start + TIMER_F)
    [failure] = failed(wire)
    assert failure.outcome == "timeout" and failure.status == 408 and "within 32 s" in failure.reason


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets_on_success() -> None:
    registrar = FakeRegistrar(username=None)
    wire, _, _, client = setup(registrar, username=None, password=None)
    registrar.forced.extend([(403, ())] * 8)
    wire.advance(1800 + 400)  # the refresh meets eight 403s in a row
    delays = [f.retry_in for f in failed(wire)]
    assert len(delays) == 8
    for failures, delay in enumerate(delays, start=1):
        ceiling = min(60.0, 4.0 * 2 ** (failures - 1))
        assert ceiling / 2 <= delay <= ceiling, (failures, delay)
    assert [f.failures for f in failed(wire)] == list(range(1, 9))
    wire.advance(60)
    assert client.registered and client.status().failures == 0 and client.status().attempts == 0
    registrar.forced.append((403, ()))
    wire.advance(1800 + 1)
    assert failed(wire)[-1].failures == 1 and failed(wire)[-1].retry_in <= 4.0


def test_retry_after_on_5xx_is_honoured_and_capped() -> None:
    registrar = FakeRegistrar(username=None)
    registrar.forced.append((503, (("Retry-After", "120 (maintenance);duration=60"),)))
    wire, _, _, client = setup(registrar, username=None, password=None)
    assert failed(wire)[0].retry_in == 120.0
    wire.advance(119.9)
    assert client.state is RegState.FAILED
    wire.advance(0.1)
    assert client.registered
    registrar.forced.append((500, (("Retry-After", "999999"),)))
    wire.advance(1800)
    assert failed(wire)[-1].retry_in == RegistrationTiming().retry_after_max_s


def test_redirects_are_failures_that_say_where() -> None:
    registrar = FakeRegistrar()
    registrar.forced.append((302, (("Contact", "<sip:other.example>"),)))
    wire, _, _, _ = setup(registrar)
    assert "redirects to <sip:other.example>" in failed(wire)[0].reason


def test_a_failed_refresh_keeps_the_binding_until_it_lapses() -> None:
    wire, _, registrar, client = setup(FakeRegistrar(max_expires=100))
    start = wire.now
    registrar.silent = True
    wire.run_until(start + 50 + TIMER_F)
    assert client.state is RegState.FAILED and client.status().expires_at == start + 100
    assert not client.registered


# --- removal -----------------------------------------------------------------------------------


def test_stop_removes_our_contact_with_expires_zero_and_the_next_cseq() -> None:
    wire, endpoint, registrar, client = setup()
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    removal = registrar.requests[-1]
    assert removal.headers.get("Expires") == "0" and removal.cseq.number == 3
    assert removal.call_id == registrar.requests[0].call_id
    assert str(removal.contacts[0].uri) == "sip:gateway@127.0.0.1:5070"  # ours, never "*"
    assert removal.contacts[0].param("expires") == "0" and removal.contacts[0].param("+sip.instance")
    assert removal.headers.get("Authorization") is not None
    [done] = unregistered(wire)
    assert done.ok and done.status == 200
    assert client.state is RegState.STOPPED and not registrar.contacts("+15550100", wire.now)
    assert endpoint.registrations.clients == [] and endpoint.registrations.next_deadline() is None
    endpoint.registrations.stop(client, wire.now, within=5)  # idempotent
    wire.advance(3600)
    assert len(unregistered(wire)) == 1 and len(registrar.requests) == 3


def test_removal_answers_a_challenge() -> None:
    wire, endpoint, registrar, client = setup(FakeRegistrar(nonce_ttl_s=10))
    wire.advance(60)
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    assert [r.headers.get("Expires") for r in registrar.requests[-2:]] == ["0", "0"]
    assert unregistered(wire)[0].ok and not registrar.contacts("+15550100", wire.now)


def test_removal_from_a_dead_registrar_gives_up_in_time() -> None:
    wire, endpoint, registrar, client = setup()
    registrar.silent = True
    stopped_at = wire.now
    endpoint.registrations.stop(client, stopped_at, within=5)
    wire.run_until(stopped_at + 4.99)
    assert not unregistered(wire)
    wire.run_until(stopped_at + 5)
    [done] = unregistered(wire)
    assert not done.ok and done.status is None and "within 5 s" in done.reason
    assert client.state is RegState.STOPPED and endpoint.registrations.clients == []


def test_removal_refused_is_reported() -> None:
    wire, endpoint, registrar, client = setup()
    registrar.forced.append((500, ()))
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    [done] = unregistered(wire)
    assert not done.ok and done.status == 500 and client.status().last_error == done.reason


def test_stop_while_registering_waits_for_the_answer_then_removes() -> None:
    registrar = FakeRegistrar()
    wire = Wire()
    endpoint = wire.add_endpoint(GW, SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(3)))
    wire.registrars[REG] = registrar
    client = endpoint.registrations.add(config(), wire.now)
    endpoint.registrations.stop(client, wire.now, within=5)  # the first REGISTER is still outstanding
    assert client.state is RegState.STOPPING
    wire.pump()
    assert [r.headers.get("Expires") for r in registrar.requests] == ["3600"]  # its 401 ends it: nothing bound
    assert unregistered(wire)[0].ok and unregistered(wire)[0].reason == "no binding was held"


def test_stop_while_registering_removes_a_binding_granted_meanwhile() -> None:
    registrar = FakeRegistrar(username=None)
    wire = Wire()
    endpoint = wire.add_endpoint(GW, SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(3)))
    wire.registrars[REG] = registrar
    client = endpoint.registrations.add(config(), wire.now)
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    assert [r.headers.get("Expires") for r in registrar.requests] == ["3600", "0"]
    assert [r.cseq.number for r in registrar.requests] == [1, 2]  # never two outstanding
    assert unregistered(wire)[0].ok and not registrar.contacts("+15550100", wire.now)
    assert not registered(wire)  # the grant was removed, not reported as a registration


def test_stop_while_registering_with_a_silent_registrar_gives_up() -> None:
    registrar = FakeRegistrar()
    registrar.silent = True
    wire, endpoint, _, client = setup(registrar)
    endpoint.registrations.stop(client, wire.now, within=3)
    wire.advance(3)
    assert unregistered(wire)[0].ok is False and client.state is RegState.STOPPED


def test_stop_after_failures_with_nothing_bound_sends_nothing() -> None:
    wire, endpoint, registrar, client = setup(password="wrong")
    sent = len(registrar.requests)
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    assert len(registrar.requests) == sent and unregistered(wire)[0].ok
    wire.advance(600)
    assert len(registrar.requests) == sent  # no retry after the stop


def test_stop_after_a_failed_refresh_still_removes_the_binding() -> None:
    wire, endpoint, registrar, client = setup(FakeRegistrar(max_expires=100))
    registrar.forced.append((500, ()))
    wire.advance(50)
    assert client.state is RegState.FAILED
    endpoint.registrations.stop(client, wire.now, within=5)
    wire.pump()
    assert registrar.requests[-1].headers.get("Expires") == "0" and unregistered(wire)[0].ok


def test_late_and_stray_responses_are_ignored() -> None:
    wire, endpoint, registrar, client = setup()
    first = registrar.requests[0]
    from gateway.sip.message import make_response

    stray = make_response(first, 200, to_tag="x", headers=(("Contact", "<sip:gateway@127.0.0.1:5070>;expires=5"),))
    endpoint.receive(stray.encode(), REG, transport="udp", now=wire.now)  # its transaction absorbs it
    wire.advance(10)
    endpoint.receive(stray.encode(), REG, transport="udp", now=wire.now)  # its transaction is gone
    wire.pump()
    assert len(registered(wire)) == 1 and client.status().expires == 3600
    assert endpoint.stats.unmatched_responses == 1


# --- the table and configuration -----------------------------------------------------------------


def test_every_row_of_the_table_names_an_action() -> None:
    from gateway.sip.registration import RegistrationClient

    for (state, event), (next_state, action) in TABLE.items():
        assert isinstance(state, RegState) and isinstance(event, RegInput) and isinstance(next_state, RegState)
        assert callable(getattr(RegistrationClient, action)), action
    assert not [key for key in TABLE if key[0] is RegState.STOPPED]  # terminal


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"registrar": "tel:+1555"}, "sip: URI"),
        ({"registrar": "sip:"}, "bad registrar"),
        ({"aor": "sip:carrier.test"}, "user part"),
        ({"expires": 0}, "expires"),
        ({"password": None}, "both"),
        ({"instance_id": 'urn:"x"'}, "instance_id"),
    ],
)
def test_bad_configuration_is_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SipConfigError, match=message):
        config(**overrides)


def test_timing_is_validated_and_backoff_is_bounded() -> None:
    with pytest.raises(SipConfigError):
        RegistrationTiming(retry_min_s=10, retry_max_s=5)
    with pytest.raises(SipConfigError):
        RegistrationTiming(refresh_fraction=1.0)
    timing = RegistrationTiming(retry_min_s=1, retry_max_s=8)
    rng = random.Random(0)
    assert all(4 <= timing.backoff(n, rng) <= 8 for n in range(4, 10_000, 97))
    for bad in (-0.1, 0.45):  # the refresh must go out at 0.1 of the grant or later
        with pytest.raises(SipConfigError, match="refresh_spread"):
            RegistrationTiming(refresh_spread=bad)


def test_refreshes_of_clients_started_together_spread_between_four_and_five_tenths_of_the_grant() -> None:
    refreshes: list[float] = []
    for seed in range(20):  # twenty workers registered at the same moment, each with its own random source
        wire = Wire()
        endpoint = wire.add_endpoint(GW, SipEndpoint(SipConfig(local_port=GW[1]), rng=random.Random(seed)))
        registrar = FakeRegistrar(max_expires=100)
        wire.registrars[REG] = registrar
        client = endpoint.registrations.add(config(timing=RegistrationTiming()), wire.now)
        wire.pump()
        start = wire.now
        refresh_at = client.status().refresh_at
        assert refresh_at is not None
        refreshes.append(refresh_at - start)
        wire.run_until(refresh_at - 0.01)
        assert len(registrar.requests) == 2  # nothing before the refresh time
        wire.run_until(refresh_at)
        assert len(registrar.requests) == 3 and registrar.requests[2].cseq.number == 3
    assert all(40.0 <= offset <= 50.0 for offset in refreshes), refreshes
    assert max(refreshes) - min(refreshes) > 5.0  # spread, not in step


def test_password_is_not_in_the_repr() -> None:
    assert "secret" not in repr(config()) and "secret" not in repr(replace(config(), expires=60))
