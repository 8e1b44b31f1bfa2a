"""A self-signed certificate for SIP over TLS in tests and local runs (``GATEWAY_SIP_TLS_SELF_SIGNED=true``).

Owns: `ensure_self_signed`, which keeps one ECDSA P-256 key and a certificate for the given names in a directory
(``cert.pem``, ``key.pem`` readable by the owner only), made with the ``cryptography`` package (which aiortc
already needs). An existing pair is used again while it is valid for another week and names every host asked
for; otherwise a new one is made. Peers cannot verify such a certificate unless given it as their CA (its
fingerprint is logged for that): it is for trying TLS out, not for a trunk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.transport.tls import certificate_fingerprint

VALID_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=7)


@dataclass(frozen=True, kw_only=True)
class SelfSignedPair:
    cert_file: Path
    key_file: Path
    fingerprint: str  # SHA-256, AB:CD:...
    names: tuple[str, ...]
    created: bool  # False: an existing pair was used again


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _covers(cert: x509.Certificate, names: tuple[str, ...], now: datetime.datetime) -> bool:
    if cert.not_valid_after_utc - RENEW_BEFORE < now or cert.not_valid_before_utc > now:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    present = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    return all(str(ipaddress.ip_address(n)) in present if _is_ip(n) else n in present for n in names)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _matching_key(cert: x509.Certificate, key_file: Path) -> bool:
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    return key.public_key() == cert.public_key()


def ensure_self_signed(
    directory: Path, names: tuple[str, ...], *, now: datetime.datetime | None = None
) -> SelfSignedPair:
    """The pair in ``directory`` for ``names`` (host names and IP addresses), made if missing, expiring or not
    naming them all. Raises OSError when the directory cannot be written."""
    now = now or datetime.datetime.now(datetime.UTC)
    names = tuple(dict.fromkeys(n for n in names if n))
    if not names:
        raise ValueError("a certificate needs at least one name")
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    if cert_file.exists() and key_file.exists():
        try:
            existing = x509.load_pem_x509_certificate(cert_file.read_bytes())
        except ValueError:
            existing = None
        if existing is not None and _covers(existing, names, now) and _matching_key(existing, key_file):
            return SelfSignedPair(
                cert_file=cert_file,
                key_file=key_file,
                fingerprint=certificate_fingerprint(cert_file),
                names=names,
                created=False,
            )
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        # A CA of itself, so a peer may take this very file as the CA bundle that verifies it.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # The key is written readable by the owner only, then both files replace any old ones at once.
    key_tmp, cert_tmp = key_file.with_suffix(".pem.tmp"), cert_file.with_suffix(".pem.tmp")
    fd = os.open(key_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key_pem)
    cert_tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(key_tmp, key_file)
    os.replace(cert_tmp, cert_file)
    return SelfSignedPair(
        cert_file=cert_file,
        key_file=key_file,
        fingerprint=certificate_fingerprint(cert_file),
        names=names,
        created=True,
    )
