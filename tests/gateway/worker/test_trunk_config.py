"""The worker's trunks (gateway/worker/trunk_config.py): the routes file's [trunks] tables checked at start-up
with messages naming the file and the key, the GATEWAY_TRUNK_* settings as exactly the trunk ``default``, where a
placed call goes through which trunk, and passwords that never show."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.sip.auth import DigestClientCredentials
from gateway.sip.config import CONFIGURED_PROXY
from gateway.worker.settings import WorkerSettings
from gateway.worker.trunk_config import InboundTrunks, dial, registration_config, trunk_media

TWO_TRUNKS = """
[[routes]]
name = "default"
did = "*"
profile = "echo"
trunk = "b"

[profiles.echo]
provider = "echo"

[trunks.a]
address = "sip.carrier-a.example:5080"
transport = "tcp"
user = "gw-a"
password = "secret-a"
register = true
expires_s = 600
sources = ["198.51.100.0/24"]
codecs = ["pcma", "PCMU"]
inbound_credentials = [{ user = "carrier-a", password = "in-a" }]

[trunks.b]
address = "127.0.0.1:5099"
outbound_proxy = "127.0.0.1:5098"
registrar = "sip:reg.carrier-b.example"
aor = "sip:+15550100@carrier-b.example"
user = "gw-b"
password = "secret-b"
register = true
sources = ["203.0.113.0/24", "2001:db8::/32"]
"""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return str(path)


def test_the_trunks_of_the_routes_file(tmp_path: Path) -> None:
    settings = WorkerSettings(worker_id="w-t", config=_file(tmp_path, TWO_TRUNKS))
    a, b = settings.trunks["a"], settings.trunks["b"]
    assert sorted(settings.trunks) == ["a", "b"]
    assert a.number_uri("+15550123") == "sip:+15550123@sip.carrier-a.example:5080;transport=tcp"
    assert a.registration is not None and a.registration.registrar == "sip:sip.carrier-a.example:5080;transport=tcp"
    assert (a.registration.aor, a.registration.username, a.registration.expires) == (
        "sip:gw-a@sip.carrier-a.example",
        "gw-a",
        600,
    )
    assert a.registration.outbound_proxy is None  # a trunk of its own: no GATEWAY_SIP_OUTBOUND_PROXY
    assert a.codecs == ("PCMA", "PCMU") and a.inbound_credentials == {"carrier-a": "in-a"}
    assert b.outbound_proxy == "sip:127.0.0.1:5098" and b.registration is not None
    assert b.registration.outbound_proxy == "sip:127.0.0.1:5098"
    assert (b.registration.registrar, b.registration.aor) == (
        "sip:reg.carrier-b.example",
        "sip:+15550100@carrier-b.example",
    )
    assert not a.legacy and not b.legacy
    for secret in ("secret-a", "secret-b", "in-a"):
        assert secret not in repr(settings.trunks) and secret not in repr(settings)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[trunks.a]\nsources = ["10.0.0.0/33"]', r"trunks\.a\.sources: .*is not a network"),
        ('[trunks.a]\ncodecs = ["g729"]', r"trunks\.a\.codecs: .*unknown codec 'g729'"),
        ('[trunks.a]\nregister = true\nuser = "u"', r"trunks\.a\.register=true needs trunks\.a\.registrar"),
        ('[trunks.a]\nregister = true\naddress = "t.example"', r"trunks\.a\.aor or trunks\.a\.user"),
        ('[trunks.a]\naddress = "t.example"\npassword = "p"', r"trunks\.a\.password needs trunks\.a\.user"),
        ('[trunks.a]\ntransport = "tls"', r"trunks\.a\.transport 'tls' is not among GATEWAY_SIP_TRANSPORTS"),
        ('[trunks.a]\nadress = "typo.example"', r"trunks\.a\.adress: Extra inputs"),
        ('[trunks.a]\ninbound_credentials = [{ user = "u", password = "p" }]', r"need sources"),
        ('[trunks."a b"]\naddress = "t.example"', r"trunk name 'a b'"),
        ('[trunks.a]\naddress = "sip:t.example"', r"trunks\.a\.address: 'sip:t\.example': give host or host:port"),
        (
            '[trunks.a]\nregister = true\nregistrar = "sip:r.example"\naor = "sip:1@r.example"\n'
            '[trunks.b]\nregister = true\nregistrar = "sip:r.example"\naor = "sip:1@r.example"',
            r"trunks\.b: registers sip:1@r\.example at sip:r\.example, as the trunk 'a' does",
        ),
    ],
)
def test_trunks_that_cannot_work_are_refused_at_start_naming_the_file_and_key(
    tmp_path: Path, table: str, message: str
) -> None:
    path = _file(tmp_path, table)
    with pytest.raises(ValidationError, match=message) as caught:
        WorkerSettings(config=path)
    assert path in str(caught.value)


def test_a_routes_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read the config file"):
        WorkerSettings(config=str(tmp_path / "missing.toml"))
    with pytest.raises(ValidationError, match="not valid TOML"):
        WorkerSettings(config=_file(tmp_path, "[trunks.a\n"))


def test_the_single_trunk_settings_are_exactly_the_trunk_named_default(tmp_path: Path) -> None:
    legacy = WorkerSettings(
        worker_id="w-eq",
        trunk="sip.carrier.example:5080",
        trunk_user="gw",
        trunk_password="pw",
        trunk_register=True,
        trunk_registrar="sip:reg.carrier.example",
        trunk_aor="sip:+15550100@carrier.example",
        trunk_register_expires_s=900,
        sip_outbound_proxy="sbc.example:5070",
    )
    assert sorted(legacy.trunks) == ["default"]
    default = legacy.trunks["default"]
    assert default.legacy and default.registration is not None
    # What the trunk does is what the settings did before trunks: the registration (its proxy the endpoint's)...
    assert default.registration == registration_config(
        legacy.trunking, transports=legacy.sip.sip_transports, worker_id="w-eq"
    )
    assert default.registration.outbound_proxy is CONFIGURED_PROXY
    # ... and a call to a number: sip:<number>@<GATEWAY_TRUNK>, the endpoint's proxy, the settings' credentials.
    credentials = DigestClientCredentials(username="gw", password="pw")
    placed = dial(legacy.trunks, "+15550123", trunk_name=None, legacy_credentials=credentials)
    assert (placed.uri, placed.outbound_proxy, placed.credentials) == (
        "sip:+15550123@sip.carrier.example:5080",
        CONFIGURED_PROXY,
        credentials,
    )
    assert dial(legacy.trunks, "+15550123", trunk_name="default", legacy_credentials=credentials) == placed

    # The same trunk written as a [trunks.default] table is the same but for where its proxy comes from.
    table = WorkerSettings(
        worker_id="w-eq",
        config=_file(
            tmp_path,
            '[trunks.default]\naddress = "sip.carrier.example:5080"\nuser = "gw"\npassword = "pw"\nregister = true\n'
            'registrar = "sip:reg.carrier.example"\naor = "sip:+15550100@carrier.example"\nexpires_s = 900\n'
            'outbound_proxy = "sbc.example:5070"\n',
        ),
    )
    from_table = table.trunks["default"]
    assert from_table.registration is not None
    assert dataclasses.replace(from_table.registration, outbound_proxy=CONFIGURED_PROXY) == default.registration
    assert dataclasses.replace(from_table, legacy=True, registration=default.registration) == default


def test_without_trunk_settings_there_is_no_trunk_and_a_number_cannot_be_called() -> None:
    settings = WorkerSettings(trunk_user="u", trunk_password="p")
    assert settings.trunks == {}
    with pytest.raises(ValueError, match=r"no trunk is configured \(GATEWAY_TRUNK\)"):
        dial(settings.trunks, "+15550123", trunk_name=None, legacy_credentials=None)
    uri = dial(settings.trunks, "sip:bob@example.net", trunk_name=None, legacy_credentials=None)
    assert uri.uri == "sip:bob@example.net" and uri.trunk is None and uri.outbound_proxy is CONFIGURED_PROXY


def test_rejecting_unmatched_calls_needs_a_trunk_with_sources(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no trunk has sources: every call would be refused"):
        WorkerSettings(trunk="t.example", trunk_unmatched_calls="reject")
    WorkerSettings(trunk_unmatched_calls="reject", config=_file(tmp_path, '[trunks.a]\nsources = ["10.0.0.0/8"]'))


def test_a_settings_password_without_a_user_is_still_taken_unless_registering() -> None:
    assert WorkerSettings(trunk="t.example", trunk_password="p").trunks["default"].user is None


def test_the_settings_trunk_and_a_default_table_cannot_both_be_given(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"trunks\.default: the settings GATEWAY_TRUNK"):
        WorkerSettings(trunk="t.example", config=_file(tmp_path, '[trunks.default]\naddress = "x.example"'))


def test_a_call_through_a_named_trunk_takes_its_address_proxy_credentials_and_codecs(tmp_path: Path) -> None:
    settings = WorkerSettings(config=_file(tmp_path, TWO_TRUNKS), trunk="legacy.example")
    trunks = settings.trunks
    via_b = dial(trunks, "+15550123", trunk_name="b", legacy_credentials=None)
    assert (via_b.uri, via_b.outbound_proxy) == ("sip:+15550123@127.0.0.1:5099", "sip:127.0.0.1:5098")
    assert isinstance(via_b.credentials, DigestClientCredentials)
    # A SIP URI through a named trunk still takes the trunk's proxy and credentials.
    uri_via_a = dial(trunks, "sip:bob@carrier-a.example", trunk_name="a", legacy_credentials=None)
    assert uri_via_a.uri == "sip:bob@carrier-a.example" and uri_via_a.outbound_proxy is None
    # No trunk named: a number takes default (the settings'), a SIP URI goes as before trunks.
    assert dial(trunks, "+1", trunk_name=None, legacy_credentials=None).uri == "sip:+1@legacy.example"
    with pytest.raises(ValueError, match=r"unknown trunk 'c' on this worker \(its trunks: a, b, default\)"):
        dial(trunks, "+1", trunk_name="c", legacy_credentials=None)
    assert trunk_media(settings.media, trunks["a"]).codecs == ("PCMA", "PCMU")
    assert trunk_media(settings.media, trunks["b"]) is settings.media


def test_an_inbound_call_is_its_trunks_by_source(tmp_path: Path) -> None:
    trunks = WorkerSettings(config=_file(tmp_path, TWO_TRUNKS)).trunks
    inbound = InboundTrunks(trunks)
    assert inbound.of("198.51.100.7") is trunks["a"] and inbound.of("2001:db8::5") is trunks["b"]
    assert inbound.of("192.0.2.1") is None


def test_the_example_routes_file_declares_trunks_both_planes_take() -> None:
    from gateway.control.config import load_config

    example = Path(__file__).resolve().parents[3] / "deploy" / "gateway.example.toml"
    assert sorted(load_config(example).trunks) == ["carrier", "pbx"]
    trunks = WorkerSettings(config=str(example)).trunks
    assert trunks["carrier"].registration is not None and trunks["pbx"].registration is None
    assert "replace-me" not in repr(trunks)
