"""SIP over UDP and TCP: the asyncio glue around the sans-I/O :class:`gateway.sip.endpoint.SipEndpoint`.

The shape is aioquic's ``asyncio/protocol.py``: receive bytes -> feed the core -> drain its datagrams and
events -> re-arm one timer at ``next_deadline()``. The application (the worker) gets the drained events
through ``on_events`` and, after acting on the endpoint, calls :meth:`SipTransport.pump` so that whatever
its actions produced leaves at once.

TCP (RFC 3261 §18): one :class:`~gateway.sip.framing.StreamFramer` per connection; responses go back on
the connection the request came in on (connections are keyed by the peer's address); requests to a peer
without a connection open one. A stream that breaks the size limits, or that the framer fails on in any
other way, is closed and counted; nothing a peer sends ends the connection task with an exception.
Destinations that are not IP literals are resolved off the loop (``getaddrinfo``) before sending.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import MessageTooLargeError
from gateway.sip.events import Outgoing, SipEvent
from gateway.sip.framing import StreamFramer
from gateway.tasks import TaskSet

log = logging.getLogger(__name__)

Address = tuple[str, int]
_TCP_READ = 65536
_TCP_IDLE_TIMEOUT_S = 300.0


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class TransportStats:
    udp_received: int = 0
    tcp_received: int = 0
    sent: int = 0
    send_failed: int = 0
    tcp_connections: int = 0
    tcp_closed_oversize: int = 0
    tcp_refused: int = 0
    tcp_closed_unframeable: int = 0
    unresolvable: int = 0


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.owner.stats.udp_received += 1
        self.owner._feed(data, (str(addr[0]), int(addr[1])), "udp")  # type: ignore[call-overload]

    def error_received(self, exc: Exception) -> None:  # ICMP errors for earlier sends: nothing to do
        log.debug("sip udp error: %s", exc)


class SipTransport:
    """Binds SIP UDP and/or TCP on one address and drives one endpoint."""

    def __init__(
        self,
        endpoint: SipEndpoint,
        *,
        host: str,
        port: int,
        transports: tuple[str, ...] = ("udp", "tcp"),
        on_events: Callable[[list[SipEvent]], None],
        max_tcp_connections: int = 1024,
    ) -> None:
        self.endpoint = endpoint
        self.host = host
        self.port = port
        self.transports = transports
        self.stats = TransportStats()
        self._on_events = on_events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.Server | None = None
        self._tcp: dict[Address, asyncio.StreamWriter] = {}
        self._tasks = TaskSet("sip transport")
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pumping = False
        self._closed = False
        self.max_tcp_connections = max_tcp_connections

    @property
    def bound_port(self) -> int:
        return self.port

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        if "udp" in self.transports:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _UdpProtocol(self), local_addr=(self.host, self.port), family=family
            )
            self._udp = transport  # type: ignore[assignment]
            if self.port == 0:
                self.port = transport.get_extra_info("sockname")[1]
        if "tcp" in self.transports:
            self._tcp_server = await asyncio.start_server(
                self._serve_tcp, host=self.host, port=self.port, family=family, reuse_address=True
            )

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    # ----------------------------------------------------------------------------------- the pump

    def pump(self) -> None:
        """Send what the endpoint queued, deliver its events, re-arm the timer. Re-entrant safe."""
        if self._pumping or self._closed:
            return
        self._pumping = True
        try:
            for _ in range(100):  # event handlers act on the endpoint, which may queue more
                datagrams = self.endpoint.datagrams()
                for outgoing in datagrams:
                    self._send(outgoing)
                events = self.endpoint.events()
                if events:
                    try:
                        self._on_events(events)
                    except Exception:
                        log.exception("SIP event handler failed")
                if not datagrams and not events:
                    break
        finally:
            self._pumping = False
        self._arm_timer()

    def _feed(self, data: bytes, source: Address, transport: str) -> None:
        if self._closed:
            return
        errors = self.endpoint.stats.internal_errors
        self.endpoint.receive(data, source, transport=transport, now=self.now())
        if self.endpoint.stats.internal_errors != errors:
            log.warning(
                "SIP core failed on a message from %s:%d (dropped): %r",
                source[0],
                source[1],
                self.endpoint.last_internal_error,
            )
        self.pump()

    def _arm_timer(self) -> None:
        deadline = self.endpoint.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None and self._loop is not None and not self._closed:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.endpoint.handle_timers(self.now())
        self.pump()

    # ----------------------------------------------------------------------------------- sending

    def _send(self, outgoing: Outgoing) -> None:
        host, port = outgoing.destination
        if not _is_ip(host):
            self._spawn(self._resolve_and_send(outgoing))
            return
        if outgoing.transport == "tcp":
            writer = self._tcp.get((host, port))
            if writer is None or writer.is_closing():
                self._spawn(self._connect_and_send(outgoing))
                return
            writer.write(outgoing.data)
            self.stats.sent += 1
            return
        if self._udp is None:
            self.stats.send_failed += 1
            return
        self._udp.sendto(outgoing.data, (host, port))
        self.stats.sent += 1

    async def _resolve_and_send(self, outgoing: Outgoing) -> None:
        assert self._loop is not None
        host, port = outgoing.destination
        try:
            infos = await asyncio.wait_for(self._loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM), timeout=5.0)
        except (OSError, TimeoutError):
            self.stats.unresolvable += 1
            log.info("cannot resolve SIP destination %s", host)
            return
        address = infos[0][4]
        self._send(Outgoing(data=outgoing.data, destination=(str(address[0]), port), transport=outgoing.transport))

    async def _connect_and_send(self, outgoing: Outgoing) -> None:
        host, port = outgoing.destination
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5.0)
        except (OSError, TimeoutError) as exc:
            self.stats.send_failed += 1
            log.info("SIP TCP connect to %s:%d failed: %s", host, port, exc)
            return
        self._tcp[(host, port)] = writer
        writer.write(outgoing.data)
        self.stats.sent += 1
        await self._read_stream(reader, writer, (host, port))

    # ------------------------------------------------------------------------------------- TCP

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tcp) >= self.max_tcp_connections:
            self.stats.tcp_refused += 1  # a connection flood must not exhaust file descriptors
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        address = (str(peer[0]), int(peer[1]))
        self._tcp[address] = writer
        task = asyncio.current_task()
        if task is not None:
            self._tasks.adopt(task)
        await self._read_stream(reader, writer, address)

    async def _read_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Address) -> None:
        self.stats.tcp_connections += 1
        framer = StreamFramer(self.endpoint.config.limits)
        try:
            while not self._closed:
                try:
                    chunk = await asyncio.wait_for(reader.read(_TCP_READ), timeout=_TCP_IDLE_TIMEOUT_S)
                except TimeoutError:
                    break
                if not chunk:
                    break
                try:
                    messages = framer.feed(chunk)
                except MessageTooLargeError:
                    self.stats.tcp_closed_oversize += 1
                    break
                except Exception as exc:  # a stream the framer cannot cut costs that stream, not the task
                    self.stats.tcp_closed_unframeable += 1
                    log.info("SIP TCP stream from %s:%d closed, cannot be framed: %.200s", *peer, exc)
                    break
                for message in messages:
                    self.stats.tcp_received += 1
                    self._feed(message, peer, "tcp")
        except (ConnectionError, OSError):
            pass
        finally:
            if self._tcp.get(peer) is writer:
                del self._tcp[peer]
            writer.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro, "sip-send")

    async def aclose(self) -> None:
        """Send what is queued, then close sockets and stop every task this transport started."""
        self.pump()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._tcp_server is not None:
            self._tcp_server.close()
        for writer in list(self._tcp.values()):
            writer.close()
        await self._tasks.aclose()
        if self._tcp_server is not None:
            await self._tcp_server.wait_closed()
