"""SIP over UDP, TCP and TLS: the asyncio glue around the sans-I/O :class:`gateway.sip.endpoint.SipEndpoint`.

The shape is aioquic's ``asyncio/protocol.py``: receive bytes -> feed the core -> drain its datagrams and
events -> re-arm one timer at ``next_deadline()``. The application (the worker) gets the drained events
through ``on_events`` and, after acting on the endpoint, calls :meth:`SipTransport.pump` so that whatever
its actions produced leaves at once.

UDP is here; TCP and TLS connections (framing, connection reuse, TLS handshakes and their failures, idle and
limit policing) are :class:`~gateway.transport.sip_streams.SipStreams`'. A message the streams cannot deliver
(no connection, a failed handshake) is reported back to the endpoint, which fails its transactions as a 503.
TLS listens on its own port (``tls_port``, 5061 by default) with the contexts of
:class:`~gateway.transport.tls.TlsContexts`; without a certificate, TLS is outgoing only. UDP destinations that
are not IP literals are resolved off the loop (``getaddrinfo``) before sending.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import Outgoing, SipEvent
from gateway.tasks import TaskSet
from gateway.transport.sip_streams import STREAM_TRANSPORTS, SipStreams, TransportStats, is_ip
from gateway.transport.tls import SipTlsConfig, TlsContexts

__all__ = ["SipTransport", "TransportStats"]

log = logging.getLogger(__name__)

Address = tuple[str, int]
IDLE_TIMEOUT_S = 300.0


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.owner.stats.udp_received += 1
        self.owner._feed(data, (str(addr[0]), int(addr[1])), "udp")  # type: ignore[call-overload]

    def error_received(self, exc: Exception) -> None:  # ICMP errors for earlier sends: nothing to do
        log.debug("sip udp error: %s", exc)


class SipTransport:
    """Binds SIP UDP and/or TCP on one address (TLS on ``tls_port``) and drives one endpoint."""

    def __init__(
        self,
        endpoint: SipEndpoint,
        *,
        host: str,
        port: int,
        transports: tuple[str, ...] = ("udp", "tcp"),
        on_events: Callable[[list[SipEvent]], None],
        max_tcp_connections: int = 1024,
        tls: TlsContexts | None = None,
        tls_port: int = 5061,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.host = host
        self.port = port
        self.tls_port = tls_port
        self.transports = transports
        self.stats = TransportStats()
        if tls is None and "tls" in transports:
            tls = TlsContexts(SipTlsConfig())  # outgoing only, servers verified against the system store
        self.tls = tls
        self._on_events = on_events
        self._loop: asyncio.AbstractEventLoop | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self.streams = SipStreams(
            stats=self.stats,
            limits=endpoint.config.limits,
            on_message=self._feed,
            on_failed=self._send_failed,
            in_use=endpoint.flow_in_use,
            tls=tls,
            max_connections=max_tcp_connections,
            idle_timeout_s=idle_timeout_s,
        )
        self._tasks = TaskSet("sip transport")
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pumping = False
        self._closed = False

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
            await self.streams.listen("tcp", self.host, self.port)
        if "tls" in self.transports and self.tls is not None and self.tls.server is not None:
            self.tls_port = await self.streams.listen("tls", self.host, self.tls_port)

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
        if outgoing.transport in STREAM_TRANSPORTS:
            self.streams.send(outgoing)
            return
        host, port = outgoing.destination
        if not is_ip(host):
            self._spawn(self._resolve_and_send(outgoing))
            return
        if self._udp is None:
            self.stats.send_failed += 1
            return
        self._udp.sendto(outgoing.data, (host, port))
        self.stats.sent += 1

    def _send_failed(self, outgoing: Outgoing, cause: str, detail: str) -> None:
        """The streams could not deliver ``outgoing``: the endpoint fails the transactions toward it."""
        if self._closed:
            return
        self.endpoint.transport_failed(outgoing, self.now(), cause=cause, detail=detail)
        self.pump()

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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro, "sip-send")

    def connection_counts(self) -> dict[str, int]:
        """Open TCP and TLS connections now, per transport."""
        return self.streams.connection_counts()

    async def aclose(self) -> None:
        """Send what is queued, then close sockets and stop every task this transport started."""
        self.pump()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._udp is not None:
            self._udp.close()
        await self.streams.aclose()
        await self._tasks.aclose()
