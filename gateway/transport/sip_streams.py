"""SIP over connections (RFC 3261 §18, §18.3 framing; TLS per §26.2 and RFC 5630): the TCP and TLS half of the
SIP transport glue.

Owns: `SipStreams` (the TCP and TLS listeners, the table of open connections, connections made on demand and
their queues, idle and limit policing) and `_Connection`, one asyncio protocol per connection, which frames
messages (`gateway.sip.framing.StreamFramer`) and, for TLS, drives a `tls_session.TlsSession` itself so that
every failure is seen and counted here (docs/adr/0020-sip-tls-over-sslobject.md).

Rules:
- A connection is known by (transport, peer IP, peer port); one made to a host name is known by that name too, so
  a dialog with sip.example.com reuses it without resolving again. Responses go back on the connection their
  request came on (§18.2.2): the endpoint addresses them to the request's source, which is that key.
- Sending: the dialog's connection (``Outgoing.flow``) while it is open, else the destination's, else a new one
  is made while the messages for it queue: TCP connect (``connect_timeout_s``), then for TLS the handshake, with
  SNI for names and, by default, the dialled name checked against the server's certificate. A connection that
  cannot be made (resolution, connect, handshake, certificate, timeout) fails every message queued for it: the
  endpoint learns it (``on_failed``) and ends the transactions toward it as a 503.
- Receiving, per transport: a stream that breaks the size limits or cannot be framed is closed and counted. On
  the TLS port: a first byte that is not a TLS handshake record (plaintext SIP, HTTP, noise), a failed handshake,
  a refused certificate and a handshake not done within the timeout are each counted; the connection is closed.
- A connection silent for ``idle_timeout_s`` is closed, unless a live call's dialog uses it (``in_use``); a peer
  that leaves more than 1 MiB of our messages unread is cut off. At most ``max_connections`` at once, both
  transports and handshakes in progress included; beyond that a new connection is closed at once, counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import cast

from gateway.sip.errors import MessageTooLargeError
from gateway.sip.events import Outgoing
from gateway.sip.framing import StreamFramer
from gateway.sip.message import SipLimits
from gateway.tasks import TaskSet
from gateway.transport.tls import TlsContexts, classify_handshake_error, describe_handshake_error
from gateway.transport.tls_session import NotTlsError, TlsSession

log = logging.getLogger(__name__)

Address = tuple[str, int]
Key = tuple[str, str, int]  # transport, host (IP, or the name it was dialled by), port
STREAM_TRANSPORTS = ("tcp", "tls")
_MAX_BACKLOG = 1 << 20  # bytes of ours a peer may leave unread before it is cut off


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class TransportStats:
    """Counters of the SIP transport, monotonically increasing (exported as gateway_sip_transport_*)."""

    udp_received: int = 0
    tcp_received: int = 0
    tls_received: int = 0
    sent: int = 0
    send_failed: int = 0
    unresolvable: int = 0
    # per stream transport: connections made usable (TLS: handshake done), inbound and outbound
    tcp_connections: int = 0
    tls_connections: int = 0
    tcp_refused: int = 0  # over max_connections
    tls_refused: int = 0
    tcp_closed_oversize: int = 0
    tls_closed_oversize: int = 0
    tcp_closed_unframeable: int = 0
    tls_closed_unframeable: int = 0
    tcp_closed_idle: int = 0
    tls_closed_idle: int = 0
    tcp_closed_backlog: int = 0
    tls_closed_backlog: int = 0
    tcp_connect_failed: int = 0  # outbound: refused, unreachable, timed out
    tls_connect_failed: int = 0
    tls_not_tls: int = 0  # the peer's first byte was not a TLS handshake record
    tls_handshake_failed: int = 0
    tls_handshake_timeout: int = 0
    tls_verify_failed: int = 0  # a certificate was refused (theirs by us, or ours by them)
    tls_record_error: int = 0  # a corrupt record after the handshake

    def count(self, transport: str, event: str, n: int = 1) -> None:
        name = f"{transport}_{event}"
        setattr(self, name, getattr(self, name) + n)

    def errors(self) -> dict[tuple[str, str], int]:
        """(transport, reason) -> count, for every counter of a connection refused, closed or failed."""
        out: dict[tuple[str, str], int] = {}
        for field in fields(self):
            transport, _, event = field.name.partition("_")
            if transport in STREAM_TRANSPORTS and event not in ("received", "connections"):
                out[transport, event] = getattr(self, field.name)
        return out


class _ConnectionFailed(Exception):
    def __init__(self, event: str, detail: str) -> None:
        super().__init__(detail)
        self.event = event
        self.detail = detail


class _Connection(asyncio.Protocol):
    """One TCP or TLS connection (inbound or outbound); bytes in -> TLS -> framer -> messages to the owner."""

    def __init__(self, owner: SipStreams, transport_name: str, *, inbound: bool, tls: TlsSession | None) -> None:
        self.owner = owner
        self.name = transport_name
        self.inbound = inbound
        self.tls = tls
        self.framer = StreamFramer(owner.limits)
        self.transport: asyncio.Transport | None = None
        self.peer: Address = ("", 0)
        self.keys: list[Key] = []
        self.ready: asyncio.Future[None] = owner.loop.create_future()
        self.up = False
        self.last_activity = owner.loop.time()
        self.received_any = False
        self.failure: _ConnectionFailed | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but is one in kind
        peer = transport.get_extra_info("peername")
        self.peer = (str(peer[0]), int(peer[1])) if peer else ("", 0)
        if not self.owner.admit(self):
            self.transport.abort()
            return
        if self.tls is None:
            self._up()
            return
        self._handshake_timer = self.owner.loop.call_later(self.owner.handshake_timeout_s, self._handshake_timed_out)
        hello = self.tls.start()
        if hello:
            self.transport.write(hello)

    def data_received(self, data: bytes) -> None:
        if self.failure is not None or self.transport is None:
            return
        self.last_activity = self.owner.loop.time()
        self.received_any = True
        plaintext = data
        if self.tls is not None:
            handshaking = not self.tls.handshake_done
            try:
                plaintext, out = self.tls.receive(data)
            except NotTlsError as exc:
                self.fail("not_tls", str(exc))
                return
            except ssl.SSLError as exc:
                if handshaking:
                    self.fail(classify_handshake_error(exc), describe_handshake_error(exc))
                else:
                    self.fail("record_error", describe_handshake_error(exc))
                return
            if out:
                self.transport.write(out)
            if handshaking and self.tls.handshake_done:
                self._up()
        if plaintext:
            self._frame(plaintext)
        if self.tls is not None and self.tls.closed and self.failure is None:
            self.close()

    def eof_received(self) -> bool | None:
        return False  # half-closed SIP connections are not kept: close ours too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if not self.up and self.failure is None and self.tls is not None and (self.received_any or not self.inbound):
            # Hung up mid-handshake (an inbound connection that said nothing at all is a port probe: not counted).
            self.failure = _ConnectionFailed("handshake_failed", f"connection closed during the TLS handshake ({exc})")
            self.owner.stats.count(self.name, "handshake_failed")
        if not self.ready.done():
            self.ready.set_exception(self.failure or _ConnectionFailed("connect_failed", f"connection lost ({exc})"))
            self.ready.exception()  # retrieved: nobody may be waiting (an inbound connection)
        self.owner.lost(self)

    # --- ours --------------------------------------------------------------------------------------

    def _up(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.up = True
        self.owner.stats.count(self.name, "connections")
        self.owner.opened(self)
        if not self.ready.done():
            self.ready.set_result(None)

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if not self.up and self.failure is None:
            self.fail("handshake_timeout", f"TLS handshake not done within {self.owner.handshake_timeout_s:g} s")

    def _frame(self, data: bytes) -> None:
        try:
            messages = self.framer.feed(data)
        except MessageTooLargeError as exc:
            self.fail("closed_oversize", str(exc))
            return
        except Exception as exc:  # a stream the framer cannot cut costs that stream, not the transport
            self.fail("closed_unframeable", f"cannot be framed: {str(exc)[:200]}")
            return
        for message in messages:
            if self.failure is not None:
                return
            self.owner.stats.count(self.name, "received")
            self.owner.on_message(message, self.peer, self.name)

    @property
    def usable(self) -> bool:
        return self.up and self.failure is None and self.transport is not None and not self.transport.is_closing()

    def write(self, data: bytes) -> bool:
        if not self.usable:
            return False
        assert self.transport is not None
        if self.tls is not None:
            try:
                data = self.tls.send(data)
            except ssl.SSLError as exc:
                self.fail("record_error", describe_handshake_error(exc))
                return False
        self.transport.write(data)
        self.last_activity = self.owner.loop.time()
        if self.transport.get_write_buffer_size() > _MAX_BACKLOG:
            self.fail("closed_backlog", "the peer does not read what it is sent")
        return True

    def fail(self, event: str, detail: str) -> None:
        """Count ``event`` for this transport and drop the connection (a TLS alert, if any, goes first)."""
        if self.failure is not None:
            return
        self.failure = _ConnectionFailed(event, detail)
        self.owner.stats.count(self.name, event)
        # Counted either way; a flood of probes or idle closes would drown the log at INFO.
        level = logging.DEBUG if event in ("closed_idle", "not_tls") else logging.INFO
        log.log(level, "SIP %s connection with %s:%d closed (%s): %s", self.name.upper(), *self.peer, event, detail)
        if self.transport is not None:
            if self.tls is not None:
                with contextlib.suppress(Exception):
                    alert = self.tls.pending()
                    if alert:
                        self.transport.write(alert)
                self.transport.close()  # flushes the alert
            else:
                self.transport.abort()

    def close(self) -> None:
        """Orderly close: TLS close_notify, then the socket once what is queued is written."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.tls is not None:
            with contextlib.suppress(Exception):
                self.transport.write(self.tls.close())
        self.transport.close()


class SipStreams:
    def __init__(
        self,
        *,
        stats: TransportStats,
        limits: SipLimits,
        on_message: Callable[[bytes, Address, str], None],
        on_failed: Callable[[Outgoing, str, str], None],
        in_use: Callable[[str, Address], bool],
        tls: TlsContexts | None,
        max_connections: int = 1024,
        idle_timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.stats = stats
        self.limits = limits
        self.on_message = on_message
        self._on_failed = on_failed
        self._in_use = in_use
        self.tls = tls
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._connections: set[_Connection] = set()
        self._open: dict[Key, _Connection] = {}
        self._pending: dict[Key, list[Outgoing]] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks = TaskSet("sip streams")
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()  # connections are only ever made and served inside it

    @property
    def handshake_timeout_s(self) -> float:
        return self.tls.config.handshake_timeout_s if self.tls is not None else 10.0

    async def listen(self, transport: str, host: str, port: int) -> int:
        """Accept ``transport`` (tcp, or tls with a server certificate) on host:port; the bound port."""
        if transport == "tls" and (self.tls is None or self.tls.server is None):
            raise ValueError("SIP over TLS needs a certificate and key to accept connections")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = await self.loop.create_server(
            lambda: self._inbound(transport), host=host, port=port, family=family, reuse_address=True
        )
        self._servers.append(server)
        self._start_sweeper()
        return int(server.sockets[0].getsockname()[1])

    def _inbound(self, transport: str) -> _Connection:
        session = None
        if transport == "tls":
            assert self.tls is not None
            self.tls.maybe_reload(self.loop.time())
            assert self.tls.server is not None
            session = TlsSession(self.tls.server, server_side=True)
        return _Connection(self, transport, inbound=True, tls=session)

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = self._tasks.spawn(self._sweep_idle(), "sip-streams-idle")

    # --- bookkeeping called by connections ---------------------------------------------------------

    def admit(self, connection: _Connection) -> bool:
        if self._closed:
            return False
        if connection.inbound and len(self._connections) >= self.max_connections:
            self.stats.count(connection.name, "refused")  # a connection flood must not exhaust file descriptors
            return False
        self._connections.add(connection)
        return True

    def opened(self, connection: _Connection) -> None:
        if connection.inbound:  # outbound ones are entered by _connect, after their queue went out
            key = (connection.name, *connection.peer)
            connection.keys.append(key)
            self._open[key] = connection

    def lost(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        for key in connection.keys:
            if self._open.get(key) is connection:
                del self._open[key]

    def connection_counts(self) -> dict[str, int]:
        """Open (usable) connections per transport, for the gauge."""
        counts = dict.fromkeys(STREAM_TRANSPORTS, 0)
        for connection in self._connections:
            if connection.up:
                counts[connection.name] += 1
        return counts

    # --- sending -----------------------------------------------------------------------------------

    def send(self, outgoing: Outgoing) -> None:
        transport = outgoing.transport
        if outgoing.flow is not None and self._write((transport, *outgoing.flow), outgoing.data):
            return
        key = (transport, *outgoing.destination)
        if self._write(key, outgoing.data):
            return
        queued = self._pending.get(key)
        if queued is not None:
            queued.append(outgoing)
            return
        if self._closed:
            return
        if transport == "tls" and self.tls is None:
            self.stats.send_failed += 1
            self._on_failed(outgoing, "tls", "SIP over TLS is not configured")
            return
        self._pending[key] = [outgoing]
        self._tasks.spawn(self._connect(key), f"sip-{transport}-connect")

    def _write(self, key: Key, data: bytes) -> bool:
        connection = self._open.get(key)
        if connection is None or not connection.write(data):
            return False
        self.stats.sent += 1
        return True

    async def _connect(self, key: Key) -> None:
        transport, host, port = key
        try:
            connection = await self._connection_to(transport, host, port)
        except _ConnectionFailed as exc:
            queued = self._pending.pop(key, [])
            self.stats.send_failed += len(queued)
            log.info("SIP %s to %s:%d failed: %s", transport.upper(), host, port, exc.detail)
            cause = {"resolve_failed": "resolve", "connect_failed": "connect"}.get(exc.event, "tls")
            for outgoing in {(o.destination, o.transport): o for o in queued}.values():
                self._on_failed(outgoing, cause, exc.detail)
            return
        # Queued messages go first, in order, then the key is entered: nothing can overtake them.
        for outgoing in self._pending.pop(key, []):
            if connection.write(outgoing.data):
                self.stats.sent += 1
            else:  # closed as soon as it was made
                self.stats.send_failed += 1
                self._on_failed(outgoing, "connect", f"the connection to {host}:{port} closed at once")
        if connection.usable:
            for alias in (key, (transport, *connection.peer)):
                if alias not in connection.keys:
                    connection.keys.append(alias)
                self._open.setdefault(alias, connection)

    async def _connection_to(self, transport: str, host: str, port: int) -> _Connection:
        address = host
        if not is_ip(host):
            try:
                infos = await asyncio.wait_for(
                    self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=self.connect_timeout_s
                )
            except (OSError, TimeoutError) as exc:
                self.stats.unresolvable += 1
                raise _ConnectionFailed("resolve_failed", f"cannot resolve {host}: {exc}") from None
            address = str(infos[0][4][0])
            existing = self._open.get((transport, address, port))
            if existing is not None and existing.usable:
                return existing
        session = None
        if transport == "tls":
            assert self.tls is not None
            self.tls.maybe_reload(self.loop.time())
            # SNI for names (RFC 6066 §3 has none for IP literals); the name checked when verifying (RFC 5922 §7).
            verify = self.tls.config.verify_server
            server_hostname = host if verify or not is_ip(host) else None
            session = TlsSession(self.tls.client, server_side=False, server_hostname=server_hostname)
        connection = _Connection(self, transport, inbound=False, tls=session)
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: connection, address, port), timeout=self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            self.stats.count(transport, "connect_failed")
            detail = str(exc) or "timed out"
            raise _ConnectionFailed("connect_failed", f"cannot connect to {host}:{port}: {detail}") from None
        try:
            await connection.ready  # the connection's own timer bounds the handshake
        except _ConnectionFailed as exc:
            what = "timed out" if exc.event == "handshake_timeout" else f"failed: {exc.detail}"
            raise _ConnectionFailed(exc.event, f"TLS handshake with {host}:{port} {what}") from None
        return connection

    # --- idle --------------------------------------------------------------------------------------

    async def _sweep_idle(self) -> None:
        period = min(30.0, max(0.05, self.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            now = self.loop.time()
            for connection in list(self._connections):
                if now - connection.last_activity < self.idle_timeout_s or not connection.up:
                    continue
                if any(self._in_use(connection.name, (host, port)) for _, host, port in connection.keys):
                    continue
                connection.fail("closed_idle", f"no traffic for {self.idle_timeout_s:g} s")

    async def aclose(self) -> None:
        self._closed = True
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.close()
        await self._tasks.aclose()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=5.0)
