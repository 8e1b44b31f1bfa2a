"""The trunk registration the settings ask for, as the SIP core's :class:`RegistrationConfig` (RFC 3261 §10.2).

Checked at start-up by :class:`gateway.worker.settings.WorkerSettings`, with messages naming the ``GATEWAY_*``
variables; used by :class:`gateway.worker.registration.TrunkRegistration`.
"""

from __future__ import annotations

import uuid

from gateway.sip.errors import RemoteProtocolError, SipConfigError
from gateway.sip.registration import RegistrationConfig, RegistrationTiming
from gateway.sip.uri import parse_uri
from gateway.worker.slices import TrunkSettings


def instance_id(worker_id: str) -> str:
    """The worker's RFC 5626 instance id: a name-based UUID of its id, the same across restarts."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'voice-gateway:worker:{worker_id}')}"


def _registrar(settings: TrunkSettings) -> str:
    if settings.trunk_registrar:
        return settings.trunk_registrar.strip()
    if not settings.trunk:
        raise ValueError("GATEWAY_TRUNK_REGISTER=true needs GATEWAY_TRUNK_REGISTRAR or GATEWAY_TRUNK")
    trunk = settings.trunk.strip()
    return trunk if trunk.startswith(("sip:", "sips:")) else f"sip:{trunk}"


def registration_config(settings: TrunkSettings, *, transports: tuple[str, ...], worker_id: str) -> RegistrationConfig:
    """The registration the trunk settings ask for, of the worker ``worker_id`` listening on ``transports``;
    ValueError (naming the variables) when they do not add up."""
    registrar = _registrar(settings)
    try:
        registrar_host = parse_uri(registrar).host
    except RemoteProtocolError as exc:
        raise ValueError(f"GATEWAY_TRUNK_REGISTRAR {registrar!r} is not a SIP URI: {exc.reason}") from exc
    aor = settings.trunk_aor.strip() if settings.trunk_aor else None
    if aor is None:
        if not settings.trunk_user:
            raise ValueError(
                "GATEWAY_TRUNK_REGISTER=true needs GATEWAY_TRUNK_AOR or GATEWAY_TRUNK_USER (the AOR's user)"
            )
        aor = f"sip:{settings.trunk_user}@{registrar_host}"
    password = settings.trunk_password.get_secret_value() if settings.trunk_password is not None else None
    if password is not None and not settings.trunk_user:
        raise ValueError("GATEWAY_TRUNK_PASSWORD needs GATEWAY_TRUNK_USER (the digest username)")
    if settings.trunk_register_retry_min_s > settings.trunk_register_retry_max_s:
        raise ValueError("GATEWAY_TRUNK_REGISTER_RETRY_MIN_S must not exceed GATEWAY_TRUNK_REGISTER_RETRY_MAX_S")
    try:
        config = RegistrationConfig(
            registrar=registrar,
            aor=aor,
            username=settings.trunk_user if password is not None else None,
            password=password,
            expires=settings.trunk_register_expires_s,
            instance_id=instance_id(worker_id),
            timing=RegistrationTiming(
                retry_min_s=settings.trunk_register_retry_min_s,
                retry_max_s=settings.trunk_register_retry_max_s,
                retry_after_max_s=max(3600.0, settings.trunk_register_retry_max_s),
            ),
        )
    except SipConfigError as exc:
        raise ValueError(f"trunk registration: {exc}") from exc
    transport = config.registrar_uri.transport
    if settings.sip_outbound_proxy is not None:  # the REGISTERs go to the proxy, over its transport
        if config.registrar_uri.secure and not parse_uri(settings.sip_outbound_proxy).secure:
            raise ValueError(
                f"GATEWAY_TRUNK_REGISTRAR {registrar!r} needs TLS on every hop and GATEWAY_SIP_OUTBOUND_PROXY "
                f"{settings.sip_outbound_proxy!r} is not sips: or transport=tls"
            )
    elif transport not in transports:
        raise ValueError(
            f"GATEWAY_TRUNK_REGISTRAR {registrar!r} asks for {transport}, which GATEWAY_SIP_TRANSPORTS "
            f"({','.join(transports)}) does not listen on"
        )
    return config
