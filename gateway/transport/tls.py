"""TLS for SIP (RFC 3261 §26.2, RFC 5630, RFC 5922 §7): the SSL contexts the stream glue uses, and their reload.

Owns: `SipTlsConfig` (certificate chain and key, CA bundle, whether servers are verified and clients asked for
certificates, the handshake timeout), `TlsContexts` (the server and client `ssl.SSLContext` built from it, built
again when the certificate or key file changes on disk, so a renewed certificate is served without a restart),
`certificate_fingerprint` and `classify_handshake_error` (which counter a failed handshake goes under).

Defaults, for a gateway that faces SIP trunks: TLS 1.2 or newer only. Servers we connect to are verified against
the system trust store (or ``ca_file`` alone, when given) and must carry the name we dialled (RFC 5922 §7.1; SNI
is sent for names, an IP literal must be in the certificate's IP SANs). Clients are not asked for a certificate:
trunks are admitted by source address and digest (GATEWAY_SIP_ALLOW, GATEWAY_SIP_AUTH_*), and most do not present
one; ``client_certs="required"`` makes it mutual TLS, checked against ``ca_file`` (or the system store). Our own
certificate is presented to servers that ask for one, too (mutual TLS toward a trunk).
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

ClientCerts = Literal["none", "optional", "required"]
_VERIFY_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# OpenSSL's reasons for a first record that is not TLS at all (plaintext SIP, HTTP, noise).
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG"}
)


class TlsConfigError(ValueError):
    """The certificate, key or CA files cannot be used (missing, unreadable, not matching)."""


@dataclass(frozen=True, kw_only=True)
class SipTlsConfig:
    """How SIP over TLS authenticates. Without ``cert_file``/``key_file`` only outgoing TLS is possible."""

    cert_file: Path | None = None  # PEM: our certificate, then its intermediates
    key_file: Path | None = None  # PEM, unencrypted
    ca_file: Path | None = None  # PEM bundle for verifying peers; None: the system trust store
    verify_server: bool = True
    client_certs: ClientCerts = "none"
    handshake_timeout_s: float = 10.0
    reload_check_s: float = 30.0  # how often (at most) the files are looked at for a renewal

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsConfigError("a TLS certificate needs its key, and a key its certificate")
        if self.client_certs not in _VERIFY_MODES:
            raise TlsConfigError(f"client_certs must be none, optional or required, not {self.client_certs!r}")
        if self.handshake_timeout_s <= 0 or self.reload_check_s < 0:
            raise TlsConfigError("handshake_timeout_s must be > 0 and reload_check_s >= 0")

    @property
    def serves(self) -> bool:
        return self.cert_file is not None


def certificate_fingerprint(pem: bytes | Path) -> str:
    """SHA-256 of the first certificate in ``pem``, as AB:CD:... (what `openssl x509 -fingerprint -sha256` shows)."""
    text = pem.read_bytes() if isinstance(pem, Path) else pem
    start = text.find(b"-----BEGIN CERTIFICATE-----")
    end = text.find(b"-----END CERTIFICATE-----", start)
    if start < 0 or end < 0:
        raise TlsConfigError("no PEM certificate found")
    der = ssl.PEM_cert_to_DER_cert(text[start : end + len(b"-----END CERTIFICATE-----")].decode("ascii"))
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def certificate_not_after(pem: Path) -> float:
    """When the first certificate in ``pem`` expires, as a Unix time (for an expiry alert)."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.read_bytes()).not_valid_after_utc.timestamp()


def classify_handshake_error(exc: BaseException) -> str:
    """The counter a failed handshake goes under: verify_failed (a certificate was refused, ours or theirs),
    not_tls (the peer does not speak TLS) or handshake_failed (anything else: no common cipher, old protocol,
    the peer hung up mid-handshake)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "verify_failed"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or ""
        if reason in _NOT_TLS_REASONS:
            return "not_tls"
        if "CERTIFICATE" in reason or reason in ("TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE"):
            return "verify_failed"
    return "handshake_failed"


def describe_handshake_error(exc: BaseException) -> str:
    """A short, human reason for logs and call records (OpenSSL's text without the source position)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return (exc.reason or exc.strerror or type(exc).__name__).replace("_", " ").lower()
    return str(exc) or type(exc).__name__


def _file_stamp(paths: tuple[Path | None, ...]) -> tuple[tuple[int, int] | None, ...]:
    stamps: list[tuple[int, int] | None] = []
    for path in paths:
        if path is None:
            stamps.append(None)
            continue
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_mtime_ns, st.st_size))
    return tuple(stamps)


def _base_context(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    return context


def _load_chain(context: ssl.SSLContext, config: SipTlsConfig) -> None:
    assert config.cert_file is not None and config.key_file is not None
    try:
        context.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot load the TLS certificate {config.cert_file} with key {config.key_file}: {exc}"
        ) from exc


def _load_trust(context: ssl.SSLContext, config: SipTlsConfig, purpose: ssl.Purpose) -> None:
    """``ca_file`` alone when given (an operator's explicit choice), else the system trust store."""
    if config.ca_file is None:
        context.load_default_certs(purpose)
        return
    try:
        context.load_verify_locations(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the TLS CA bundle {config.ca_file}: {exc}") from exc


def build_server_context(config: SipTlsConfig) -> ssl.SSLContext:
    context = _base_context(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(context, config)
    context.verify_mode = _VERIFY_MODES[config.client_certs]
    if config.client_certs != "none":
        _load_trust(context, config, ssl.Purpose.CLIENT_AUTH)
    return context


def build_client_context(config: SipTlsConfig) -> ssl.SSLContext:
    context = _base_context(ssl.PROTOCOL_TLS_CLIENT)
    if config.verify_server:
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        _load_trust(context, config, ssl.Purpose.SERVER_AUTH)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.serves:
        _load_chain(context, config)  # presented when a server asks (mutual TLS toward a trunk)
    return context


class TlsContexts:
    """The server and client contexts of one transport; :meth:`maybe_reload` picks up renewed files."""

    def __init__(self, config: SipTlsConfig) -> None:
        self.config = config
        self.server: ssl.SSLContext | None = build_server_context(config) if config.serves else None
        self.client: ssl.SSLContext = build_client_context(config)
        self.fingerprint = certificate_fingerprint(config.cert_file) if config.cert_file is not None else None
        self.not_after = certificate_not_after(config.cert_file) if config.cert_file is not None else None
        self.reloads = 0
        self.reload_failures = 0
        self._stamp = self._files_stamp()
        self._checked_at: float | None = None

    def _files_stamp(self) -> tuple[tuple[int, int] | None, ...]:
        return _file_stamp((self.config.cert_file, self.config.key_file, self.config.ca_file))

    def maybe_reload(self, now: float) -> bool:
        """Build the contexts again if the files changed since they were read (checked at most every
        ``reload_check_s``). Connections already up keep their session; a bad new file keeps the old contexts.
        True when new contexts were taken."""
        if self._checked_at is not None and now - self._checked_at < self.config.reload_check_s:
            return False
        self._checked_at = now
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return False
        try:
            server = build_server_context(self.config) if self.config.serves else None
            client = build_client_context(self.config)
            fingerprint = certificate_fingerprint(self.config.cert_file) if self.config.cert_file else None
            not_after = certificate_not_after(self.config.cert_file) if self.config.cert_file else None
        except (TlsConfigError, OSError, ssl.SSLError, ValueError) as exc:
            self.reload_failures += 1
            log.warning("SIP TLS: the certificate files changed but cannot be used (keeping the old ones): %s", exc)
            return False
        # A half-written pair may fail above and succeed on a later check: only a usable pair is remembered.
        self._stamp = stamp
        self.server, self.client = server, client
        self.reloads += 1
        log.info("SIP TLS: certificate reloaded from %s, SHA-256 fingerprint %s", self.config.cert_file, fingerprint)
        self.fingerprint, self.not_after = fingerprint, not_after
        return True
