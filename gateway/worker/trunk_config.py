"""The worker's trunks, resolved and checked at start-up: where calls to numbers go, the credentials answering
each trunk's challenges, its registration (the SIP core's :class:`RegistrationConfig`, RFC 3261 §10.2), and which
callers are its own and what they must answer our challenge with.

Two sources, one shape (:class:`gateway.fleet.trunks.TrunkConfig`):

* the ``[trunks.<name>]`` tables of the routes file (``GATEWAY_CONFIG``), messages naming ``<file>: trunks.<name>``;
* the single-trunk settings (``GATEWAY_TRUNK``, ``GATEWAY_TRUNK_USER``, ..., ``GATEWAY_SIP_OUTBOUND_PROXY``): the
  trunk named ``default`` (:func:`default_trunk_config`), messages naming the ``GATEWAY_*`` variables.

Checked by :class:`gateway.worker.settings.WorkerSettings`; used by :class:`gateway.worker.registration.
TrunkRegistration` (the registrations), :class:`gateway.worker.sip_calls.SipCalls` (placed calls) and
:func:`gateway.worker.assemble.sip_config` (the inbound match by source, gateway/sip/trunk_auth.py).
"""

from __future__ import annotations

import dataclasses
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from gateway.fleet.trunks import DEFAULT_TRUNK, TrunkConfig, TrunksSection
from gateway.sip.auth import ClientCredentials, DigestClientCredentials
from gateway.sip.config import CONFIGURED_PROXY, ProxyChoice, check_outbound_proxy
from gateway.sip.errors import RemoteProtocolError, SipConfigError
from gateway.sip.registration import RegistrationConfig, RegistrationTiming
from gateway.sip.trunk_auth import SourceTrunks, TrunkSource
from gateway.sip.uri import parse_uri
from gateway.worker.slices import MediaSettings, TrunkSettings

Keys = Callable[[str], str]  # a TrunkConfig key -> how the messages name it

_ENV_KEYS = {
    "address": "GATEWAY_TRUNK",
    "outbound_proxy": "GATEWAY_SIP_OUTBOUND_PROXY",
    "user": "GATEWAY_TRUNK_USER",
    "password": "GATEWAY_TRUNK_PASSWORD",
    "register": "GATEWAY_TRUNK_REGISTER",
    "registrar": "GATEWAY_TRUNK_REGISTRAR",
    "aor": "GATEWAY_TRUNK_AOR",
    "expires_s": "GATEWAY_TRUNK_REGISTER_EXPIRES_S",
}


def env_keys(key: str) -> str:
    return _ENV_KEYS[key]


def file_keys(name: str) -> Keys:
    return lambda key: f"trunks.{name}.{key}"


def instance_id(worker_id: str) -> str:
    """The worker's RFC 5626 instance id: a name-based UUID of its id, the same across restarts."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'voice-gateway:worker:{worker_id}')}"


@dataclass(frozen=True, kw_only=True)
class Trunk:
    """One trunk as the worker uses it."""

    name: str
    address: str | None = None  # host[:port]: sip:<number>@<address>
    transport: str | None = None
    outbound_proxy: str | None = None  # a SIP URI; None: straight to the Request-URI's host
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    registration: RegistrationConfig | None = None
    sources: tuple[str, ...] = ()
    codecs: tuple[str, ...] = ()  # empty: GATEWAY_CODECS
    inbound_credentials: dict[str, str] = field(default_factory=dict, repr=False)
    legacy: bool = False  # made of the GATEWAY_TRUNK_* settings: its calls go exactly as before trunks

    def number_uri(self, number: str) -> str | None:
        """Where a call to a bare ``number`` through this trunk goes (None: the trunk has no address)."""
        if self.address is None:
            return None
        return f"sip:{number}@{self.address}" + (f";transport={self.transport}" if self.transport else "")


def default_trunk_config(settings: TrunkSettings) -> TrunkConfig:
    """The single-trunk settings as the trunk named ``default``."""
    return TrunkConfig(
        address=settings.trunk,
        outbound_proxy=settings.sip_outbound_proxy,
        user=settings.trunk_user,
        password=settings.trunk_password,
        register=settings.trunk_register,
        registrar=settings.trunk_registrar,
        aor=settings.trunk_aor,
        expires_s=settings.trunk_register_expires_s,
    )


def _proxy(text: str) -> str:
    return text if text.lower().startswith(("sip:", "sips:")) else f"sip:{text}"


def resolve_trunk(
    name: str,
    config: TrunkConfig,
    *,
    keys: Keys,
    settings: TrunkSettings,
    transports: tuple[str, ...],
    worker_id: str,
) -> Trunk:
    """``config`` checked against the worker's transports; ValueError naming the keys when it does not add up.
    ``settings`` gives what all trunks share (the registrations' retry timing)."""
    address = config.address
    if address is not None and keys is not env_keys and (address.startswith(("sip:", "sips:")) or "@" in address):
        raise ValueError(f"{keys('address')}: {address!r}: give host or host:port (numbers go to sip:<n>@<address>)")
    proxy = _proxy(config.outbound_proxy) if config.outbound_proxy else None
    if proxy is not None:
        try:
            check_outbound_proxy(proxy, transports)
        except SipConfigError as exc:
            raise ValueError(f"{keys('outbound_proxy')}: {exc}") from exc
    if config.transport is not None and config.transport not in transports:
        raise ValueError(
            f"{keys('transport')} {config.transport!r} is not among GATEWAY_SIP_TRANSPORTS ({','.join(transports)})"
        )
    password = config.password.get_secret_value() if config.password is not None else None
    # The settings took a password without a user unless registering (it was then unused): still so for them.
    if password is not None and not config.user and (config.registers or keys is not env_keys):
        raise ValueError(f"{keys('password')} needs {keys('user')} (the digest username)")
    trunk = Trunk(
        name=name,
        address=config.address,
        transport=config.transport,
        outbound_proxy=proxy,
        user=config.user,
        password=password,
        sources=tuple(config.sources),
        codecs=tuple(config.codecs),
        inbound_credentials={c.user: c.password.get_secret_value() for c in config.inbound_credentials},
    )
    if not config.registers:
        return trunk
    registration = _registration(
        config, trunk, keys=keys, settings=settings, transports=transports, worker_id=worker_id
    )
    return dataclasses.replace(trunk, registration=registration)


def _registration(
    config: TrunkConfig,
    trunk: Trunk,
    *,
    keys: Keys,
    settings: TrunkSettings,
    transports: tuple[str, ...],
    worker_id: str,
) -> RegistrationConfig:
    if config.registrar:
        registrar = config.registrar
    elif config.address:
        registrar = config.address if config.address.startswith(("sip:", "sips:")) else f"sip:{config.address}"
        if config.transport:
            registrar += f";transport={config.transport}"
    else:
        raise ValueError(f"{keys('register')}=true needs {keys('registrar')} or {keys('address')}")
    try:
        registrar_host = parse_uri(registrar).host
    except RemoteProtocolError as exc:
        raise ValueError(f"{keys('registrar')} {registrar!r} is not a SIP URI: {exc.reason}") from exc
    aor = config.aor
    if aor is None:
        if not config.user:
            raise ValueError(f"{keys('register')}=true needs {keys('aor')} or {keys('user')} (the AOR's user)")
        aor = f"sip:{config.user}@{registrar_host}"
    if settings.trunk_register_retry_min_s > settings.trunk_register_retry_max_s:
        raise ValueError("GATEWAY_TRUNK_REGISTER_RETRY_MIN_S must not exceed GATEWAY_TRUNK_REGISTER_RETRY_MAX_S")
    try:
        registration = RegistrationConfig(
            registrar=registrar,
            aor=aor,
            username=trunk.user if trunk.password is not None else None,
            password=trunk.password,
            expires=config.expires_s,
            instance_id=instance_id(worker_id),
            timing=RegistrationTiming(
                retry_min_s=settings.trunk_register_retry_min_s,
                retry_max_s=settings.trunk_register_retry_max_s,
                retry_after_max_s=max(3600.0, settings.trunk_register_retry_max_s),
            ),
            outbound_proxy=trunk.outbound_proxy,
        )
    except SipConfigError as exc:
        raise ValueError(f"{keys('register')}: trunk registration: {exc}") from exc
    if trunk.outbound_proxy is not None:  # the REGISTERs go to the proxy, over its transport
        if registration.registrar_uri.secure and not parse_uri(trunk.outbound_proxy).secure:
            raise ValueError(
                f"{keys('registrar')} {registrar!r} needs TLS on every hop and {keys('outbound_proxy')} "
                f"{trunk.outbound_proxy!r} is not sips: or transport=tls"
            )
    elif registration.registrar_uri.transport not in transports:
        raise ValueError(
            f"{keys('registrar')} {registrar!r} asks for {registration.registrar_uri.transport}, which "
            f"GATEWAY_SIP_TRANSPORTS ({','.join(transports)}) does not listen on"
        )
    return registration


def registration_config(settings: TrunkSettings, *, transports: tuple[str, ...], worker_id: str) -> RegistrationConfig:
    """The registration the single-trunk settings ask for (``GATEWAY_TRUNK_REGISTER=true``); ValueError naming
    the variables when they do not add up."""
    trunk = resolve_trunk(
        DEFAULT_TRUNK,
        default_trunk_config(settings).model_copy(update={"registers": True}),
        keys=env_keys,
        settings=settings,
        transports=transports,
        worker_id=worker_id,
    )
    registration = _legacy(trunk).registration
    assert registration is not None
    return registration


def _legacy(trunk: Trunk) -> Trunk:
    """The trunk ``default`` of the settings: its calls and REGISTERs take the endpoint's configured proxy
    (``GATEWAY_SIP_OUTBOUND_PROXY``) as they did before trunks."""
    registration = trunk.registration
    if registration is not None:
        registration = dataclasses.replace(registration, outbound_proxy=CONFIGURED_PROXY)
    return dataclasses.replace(trunk, legacy=True, registration=registration)


def read_trunks_file(path: str | Path) -> dict[str, TrunkConfig]:
    """The ``[trunks.<name>]`` tables of the routes file; ValueError naming the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    try:
        return TrunksSection.model_validate(data).trunks
    except ValidationError as exc:
        lines = [
            f"{path}: {'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        raise ValueError("\n  ".join(lines)) from None


def worker_trunks(
    settings: TrunkSettings, *, transports: tuple[str, ...], worker_id: str, source: str | None = None
) -> dict[str, Trunk]:
    """Every trunk of the worker, by name: the routes file's ``[trunks]`` (when ``source`` names the file) and,
    when ``GATEWAY_TRUNK`` or its registration is set, ``default`` from the settings."""
    configs = read_trunks_file(source) if source else {}
    trunks: dict[str, Trunk] = {}
    for name, config in configs.items():
        try:
            trunks[name] = resolve_trunk(
                name, config, keys=file_keys(name), settings=settings, transports=transports, worker_id=worker_id
            )
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    legacy = default_trunk_config(settings)
    if settings.trunk or settings.trunk_register:
        if DEFAULT_TRUNK in trunks:
            raise ValueError(
                f"{source}: trunks.{DEFAULT_TRUNK}: the settings GATEWAY_TRUNK/GATEWAY_TRUNK_REGISTER already make the "
                "trunk named default; unset them or rename the table"
            )
        resolved = resolve_trunk(
            DEFAULT_TRUNK, legacy, keys=env_keys, settings=settings, transports=transports, worker_id=worker_id
        )
        trunks[DEFAULT_TRUNK] = _legacy(resolved)
    if settings.trunk_unmatched_calls == "reject" and not any(trunk.sources for trunk in trunks.values()):
        raise ValueError(
            "GATEWAY_TRUNK_UNMATCHED_CALLS=reject refuses calls from no trunk's sources, and no trunk has sources: "
            "every call would be refused"
        )
    bindings: dict[tuple[str, str], str] = {}
    for name, trunk in trunks.items():
        if trunk.registration is not None:
            binding = (trunk.registration.registrar, trunk.registration.aor)
            if binding in bindings:
                raise ValueError(
                    f"{source}: trunks.{name}: registers {binding[1]} at {binding[0]}, as the trunk "
                    f"{bindings[binding]!r} does"
                )
            bindings[binding] = name
    return trunks


@dataclass(frozen=True, kw_only=True)
class Dial:
    """How a placed call goes out: its Request-URI, through which trunk (None: no trunk, as the URI says), the
    proxy (``CONFIGURED_PROXY``: ``GATEWAY_SIP_OUTBOUND_PROXY``) and the credentials answering a 401/407."""

    uri: str
    trunk: Trunk | None
    outbound_proxy: ProxyChoice = CONFIGURED_PROXY
    credentials: ClientCredentials | None = field(default=None, repr=False)


def dial(
    trunks: dict[str, Trunk], to: str, *, trunk_name: str | None, legacy_credentials: ClientCredentials | None
) -> Dial:
    """Where a call to ``to`` (a SIP URI or a number) goes: through ``trunk_name``, else (a number) the trunk
    ``default``; a SIP URI without a trunk named goes as before trunks (``GATEWAY_SIP_OUTBOUND_PROXY``,
    ``GATEWAY_TRUNK_USER``). ValueError when it cannot go."""
    if trunk_name is not None and trunk_name not in trunks:
        known = ", ".join(sorted(trunks)) or "none"
        raise ValueError(f"unknown trunk {trunk_name!r} on this worker (its trunks: {known})")
    is_uri = to.startswith(("sip:", "sips:", "tel:"))
    name = trunk_name if trunk_name is not None else (None if is_uri else DEFAULT_TRUNK)
    trunk = trunks.get(name) if name is not None else None
    if trunk is None:
        if not is_uri:
            raise ValueError(f"{to!r} is a number, not a SIP URI, and no trunk is configured (GATEWAY_TRUNK)")
        return Dial(uri=to, trunk=None, credentials=legacy_credentials)
    uri = to if is_uri else trunk.number_uri(to)
    if uri is None:
        raise ValueError(f"{to!r} is a number and the trunk {trunk.name!r} has no address")
    if trunk.legacy:
        return Dial(uri=uri, trunk=trunk, credentials=legacy_credentials)
    credentials = (
        DigestClientCredentials(username=trunk.user, password=trunk.password)
        if trunk.user and trunk.password is not None
        else None
    )
    return Dial(uri=uri, trunk=trunk, outbound_proxy=trunk.outbound_proxy, credentials=credentials)


def trunk_media(media: MediaSettings, trunk: Trunk | None) -> MediaSettings:
    """The media settings of a call through ``trunk``: its codecs, in its order, when it names them."""
    if trunk is None or not trunk.codecs:
        return media
    return media.model_copy(update={"codecs": trunk.codecs})


class InboundTrunks:
    """The trunk a call comes from, by its source address (the policy's own match: gateway/sip/trunk_auth.py)."""

    def __init__(self, trunks: dict[str, Trunk]) -> None:
        self._trunks = trunks
        self._sources = SourceTrunks(
            tuple(TrunkSource(name=t.name, networks=t.sources) for t in trunks.values() if t.sources)
        )

    def of(self, host: str) -> Trunk | None:
        source = self._sources.trunk_of(host)
        return self._trunks[source.name] if source is not None else None
