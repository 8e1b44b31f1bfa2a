"""RTP/RTCP sockets: a pool of even port pairs and a cheap non-blocking reader per call.

Each call owns one UDP socket for RTP (even port) and one for RTCP (port + 1), taken from a configured
range and given back when the call ends. Reading uses ``loop.add_reader`` and reads one datagram with
``recvfrom(2048)`` per readiness callback (the poller is level-triggered: a socket with more queued is ready
again at once). asyncio's datagram transport asks ``recvfrom(256 KiB)`` for every datagram, an allocation
1,000 times the size of a 172-byte RTP packet (see docs/adr/0002-rtp-socket-reader.md).
Only this module touches the sockets; parsing and everything after it is the media core's job.

Destinations must be IP literals. SDP may name a host (``c=IN IP4 rtp.example.com``, RFC 4566 §5.7), and
``sendto`` given a name resolves it with a blocking ``getaddrinfo``, on the event loop, for every packet;
so a datagram to a name is dropped and counted (``SocketStats.not_an_address``) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Address = tuple[str, int]
DatagramHandler = Callable[[bytes, Address], None]

_MAX_DATAGRAM = 2048


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class PortsExhaustedError(RuntimeError):
    """No free even port pair is left in the configured RTP range."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RtpPortRange:
    host: str = "127.0.0.1"
    first: int = 20000
    last: int = 29999

    def __post_init__(self) -> None:
        if not (1024 <= self.first < self.last <= 65535):
            raise ValueError(f"bad RTP port range {self.first}-{self.last}")


@dataclass(slots=True)
class SocketStats:
    received: int = 0
    sent: int = 0
    send_dropped: int = 0
    not_an_address: int = 0  # of send_dropped: the destination was a name, not an IP literal


class _Reader:
    __slots__ = ("handler", "sock", "stats")

    def __init__(self, sock: socket.socket, handler: DatagramHandler, stats: SocketStats) -> None:
        self.sock = sock
        self.handler = handler
        self.stats = stats

    def __call__(self) -> None:
        # One datagram per readiness callback: the poller is level-triggered, so a socket with more queued is
        # ready again on the next loop pass. Draining until EAGAIN would cost every packet a second syscall
        # and an exception, since a call's socket almost always holds exactly one packet per 20 ms.
        try:
            data, addr = self.sock.recvfrom(_MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # ICMP port unreachable surfaces as ECONNREFUSED on Linux
            if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                log.debug("rtp recv error: %s", exc)
            return
        self.stats.received += 1
        try:
            self.handler(data, addr[:2])
        except Exception:  # one bad packet or call must not stop the reader of others
            log.exception("rtp handler failed")


@dataclass(slots=True)
class RtpEndpoint:
    """One call's RTP + RTCP socket pair."""

    host: str
    port: int
    rtp_sock: socket.socket
    rtcp_sock: socket.socket
    stats: SocketStats = field(default_factory=SocketStats)
    _loop: asyncio.AbstractEventLoop | None = None
    _closed: bool = False
    _literal_hosts: set[str] = field(default_factory=set)  # destinations already checked (one or two)

    @property
    def rtcp_port(self) -> int:
        return self.port + 1

    def start(self, on_rtp: DatagramHandler, on_rtcp: DatagramHandler) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        loop.add_reader(self.rtp_sock.fileno(), _Reader(self.rtp_sock, on_rtp, self.stats))
        loop.add_reader(self.rtcp_sock.fileno(), _Reader(self.rtcp_sock, on_rtcp, SocketStats()))

    def send_rtp(self, data: bytes, addr: Address) -> None:
        self._send(self.rtp_sock, data, addr)

    def send_rtcp(self, data: bytes, addr: Address) -> None:
        self._send(self.rtcp_sock, data, addr)

    def _send(self, sock: socket.socket, data: bytes, addr: Address) -> None:
        if self._closed:
            return
        host = addr[0]
        if host not in self._literal_hosts:
            if not _is_ip_literal(host):
                if not self.stats.not_an_address:
                    log.info("rtp: not sending to %.100r, which is a name, not an address", host)
                self.stats.not_an_address += 1
                self.stats.send_dropped += 1
                return
            self._literal_hosts.add(host)
        try:
            sock.sendto(data, addr)
            self.stats.sent += 1
        except (BlockingIOError, InterruptedError):
            self.stats.send_dropped += 1  # a full send buffer: late audio is useless, drop it
        except OSError as exc:
            self.stats.send_dropped += 1
            log.debug("rtp send to %s failed: %s", addr, exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in (self.rtp_sock, self.rtcp_sock):
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()


class RtpPortPool:
    """Hands out even RTP ports (RTCP on +1) from a range; a port pair is bound before it is handed out."""

    def __init__(self, port_range: RtpPortRange, *, rcvbuf: int = 256 * 1024) -> None:
        self.range = port_range
        self._rcvbuf = rcvbuf
        first_even = port_range.first + (port_range.first % 2)
        self._candidates = list(range(first_even, port_range.last, 2))
        self._next = 0
        self._in_use: set[int] = set()

    @property
    def in_use(self) -> frozenset[int]:
        return frozenset(self._in_use)

    @property
    def capacity(self) -> int:
        return len(self._candidates)

    def allocate(self) -> RtpEndpoint:
        family = socket.AF_INET6 if ":" in self.range.host else socket.AF_INET
        for _ in range(len(self._candidates)):
            port = self._candidates[self._next]
            self._next = (self._next + 1) % len(self._candidates)
            if port in self._in_use:
                continue
            rtp = socket.socket(family, socket.SOCK_DGRAM)
            rtcp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                rtp.bind((self.range.host, port))
                rtcp.bind((self.range.host, port + 1))
            except OSError:
                rtp.close()
                rtcp.close()
                continue
            for sock in (rtp, rtcp):
                sock.setblocking(False)
            with contextlib.suppress(OSError):
                rtp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            self._in_use.add(port)
            return RtpEndpoint(host=self.range.host, port=port, rtp_sock=rtp, rtcp_sock=rtcp)
        raise PortsExhaustedError(f"no free RTP port pair in {self.range.first}-{self.range.last}")

    def release(self, endpoint: RtpEndpoint) -> None:
        endpoint.close()
        self._in_use.discard(endpoint.port)
