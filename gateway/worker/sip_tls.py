"""The worker's SIP over TLS set-up: settings -> :class:`~gateway.transport.tls.TlsContexts`, self-signed if asked.

With ``sip_tls_self_signed`` a pair is kept in ``state_dir/sip-tls`` (gateway/transport/self_signed.py), named
for localhost, 127.0.0.1, the SIP address and the advertised host, and the gateway says so loudly: what it did,
where, and the certificate's fingerprint, which a peer must be told to trust. It is for tests and trying TLS out;
a trunk needs a certificate it can verify (GATEWAY_SIP_TLS_CERT / GATEWAY_SIP_TLS_KEY).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

from gateway.transport.self_signed import ensure_self_signed
from gateway.transport.tls import SipTlsConfig, TlsContexts

if TYPE_CHECKING:
    from gateway.worker.settings import SipTlsSettings

log = logging.getLogger(__name__)


def _names(hosts: tuple[str | None, ...]) -> tuple[str, ...]:
    names = ["localhost", "127.0.0.1"]
    for host in hosts:
        if not host:
            continue
        try:
            if ipaddress.ip_address(host).is_unspecified:
                continue  # 0.0.0.0 / :: are bind addresses, not names
        except ValueError:
            pass
        names.append(host)
    return tuple(dict.fromkeys(names))


def sip_tls_contexts(
    settings: SipTlsSettings, *, transports: tuple[str, ...], hosts: tuple[str | None, ...]
) -> TlsContexts | None:
    """The TLS contexts of the worker's SIP transport; None when TLS is not among its ``transports``. A
    self-signed pair names ``hosts`` (the advertised and the SIP address). Raises TlsConfigError (files
    unusable) or OSError (the self-signed pair cannot be written)."""
    if "tls" not in transports:
        return None
    cert, key = settings.sip_tls_cert, settings.sip_tls_key
    if settings.sip_tls_self_signed:
        directory = settings.state_dir.expanduser() / "sip-tls"
        pair = ensure_self_signed(directory, _names(hosts))
        log.warning(
            "SIP TLS: %s a SELF-SIGNED certificate for %s: %s (key %s), SHA-256 fingerprint %s. Peers must be given "
            "this certificate as their CA, or not verify; use GATEWAY_SIP_TLS_CERT/GATEWAY_SIP_TLS_KEY for trunks.",
            "made" if pair.created else "using",
            ", ".join(pair.names),
            pair.cert_file,
            pair.key_file,
            pair.fingerprint,
        )
        cert, key = pair.cert_file, pair.key_file
    contexts = TlsContexts(
        SipTlsConfig(
            cert_file=cert,
            key_file=key,
            ca_file=settings.sip_tls_ca,
            verify_server=settings.sip_tls_verify_server,
            client_certs=settings.sip_tls_client_certs,
            handshake_timeout_s=settings.sip_tls_handshake_timeout_s,
        )
    )
    if not settings.sip_tls_self_signed:
        log.info("SIP TLS: certificate %s, SHA-256 fingerprint %s", cert, contexts.fingerprint)
    if not settings.sip_tls_verify_server:
        log.warning("SIP TLS: servers' certificates are NOT verified (GATEWAY_SIP_TLS_VERIFY_SERVER=false)")
    return contexts
