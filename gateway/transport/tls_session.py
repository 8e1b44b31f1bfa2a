"""One TLS connection's protocol state without I/O: ciphertext in -> plaintext out, plaintext in -> ciphertext out.

Owns: `TlsSession`, an `ssl.SSLObject` over two `ssl.MemoryBIO`s (the way asyncio's own ``sslproto`` drives the
stdlib's TLS), and `NotTlsError`. The stream glue (sip_streams.py) feeds it what the socket read and writes what
it returns, so every failure surfaces where the glue can count it: asyncio's ``start_server(ssl=...)`` never shows
a failed handshake to the application, and uvloop's ``start_tls`` reports a peer speaking plaintext only when the
handshake times out (docs/adr/0020-sip-tls-over-sslobject.md).

A server session checks the first byte before OpenSSL sees it: a TLS connection opens with a handshake record
(content type 22, RFC 8446 §5.1); anything else (plaintext SIP, an HTTP request, noise) raises `NotTlsError`.
"""

from __future__ import annotations

import contextlib
import ssl

_HANDSHAKE_RECORD = 0x16
_READ_CHUNK = 65536


class NotTlsError(Exception):
    """The peer's first byte is not a TLS handshake record (it speaks plaintext or garbage to the TLS port)."""


class TlsSession:
    def __init__(self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self.server_side = server_side
        self.handshake_done = False
        self.closed = False  # the peer sent close_notify
        self._first_byte_seen = False

    def start(self) -> bytes:
        """Begin the handshake: a client's ClientHello (a server has nothing to say first)."""
        if not self.server_side:
            self._handshake()
        return self._drain()

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Ciphertext from the peer -> (plaintext for the application, ciphertext to send back).

        Raises NotTlsError, ssl.SSLError (a failed handshake: ssl.SSLCertVerificationError for a refused
        certificate), or ssl.SSLError later for a corrupt record."""
        if data and not self._first_byte_seen:
            self._first_byte_seen = True
            if self.server_side and data[0] != _HANDSHAKE_RECORD:
                raise NotTlsError(f"first byte 0x{data[0]:02x} is not a TLS handshake record")
        self._incoming.write(data)
        if not self.handshake_done:
            self._handshake()
            if not self.handshake_done:
                return b"", self._drain()
        chunks: list[bytes] = []
        while not self.closed:
            try:
                chunk = self._ssl.read(_READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks), self._drain()

    def send(self, plaintext: bytes) -> bytes:
        """Application data -> ciphertext to write (only once the handshake is done)."""
        if not self.handshake_done:
            raise ssl.SSLError("TLS handshake not complete")
        self._ssl.write(plaintext)
        return self._drain()

    def close(self) -> bytes:
        """Our close_notify (best effort: a session that never finished its handshake has none)."""
        if self.handshake_done:
            # SSLWantReadError: the peer's close_notify is not awaited.
            with contextlib.suppress(ssl.SSLError, ValueError):
                self._ssl.unwrap()
        return self._drain()

    def pending(self) -> bytes:
        """Ciphertext still to send (the alert OpenSSL wrote before a failed handshake raised)."""
        return self._drain()

    def version(self) -> str | None:
        return self._ssl.version()

    def cipher(self) -> str | None:
        cipher = self._ssl.cipher()
        return cipher[0] if cipher else None

    def peer_certificate(self) -> dict[str, object] | None:
        cert = self._ssl.getpeercert()
        return dict(cert) if cert else None

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return
        self.handshake_done = True

    def _drain(self) -> bytes:
        return self._outgoing.read()
