"""RTP/RTCP sockets: a pool of even port pairs and a cheap non-blocking reader per call.

Each call owns one UDP socket for RTP (even port) and one for RTCP (port + 1), taken from a configured
range and given back when the call ends. Two ways of reading:

- :meth:`RtpEndpoint.start`: ``loop.add_reader`` and one ``recvfrom(2048)`` per readiness callback (the poller
  is level-triggered: a socket with more queued is ready again at once). asyncio's datagram transport asks
  ``recvfrom(256 KiB)`` for every datagram, an allocation 1,000 times the size of a 172-byte RTP packet
  (docs/adr/0002-rtp-socket-reader.md). RTCP always reads this way.
- :meth:`RtpEndpoint.start_drained`: the socket joins an :class:`RtpDrain`, which the media tick empties once
  per 20 ms with one ``epoll_wait`` for all calls, and each datagram carries the kernel's arrival time
  (``SO_TIMESTAMPNS``), so jitter statistics do not depend on when it was read
  (docs/adr/0007-rtp-read-by-the-tick.md). Linux only; elsewhere :func:`RtpDrain.supported` is false.

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
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.transport.errors import PortsExhaustedError

log = logging.getLogger(__name__)

Address = tuple[str, int]
DatagramHandler = Callable[[bytes, Address], object]  # what it returns is ignored
#: ``(data, source, arrival)``: arrival on the event loop's clock (``time.monotonic``), from the kernel.
TimedDatagramHandler = Callable[[bytes, Address, float], object]

_MAX_DATAGRAM = 2048
_IGNORED_RECV_ERRORS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)  # ICMP errors surfacing
# Linux: SO_TIMESTAMPNS (== SCM_TIMESTAMPNS) asks for a struct timespec of the arrival, CLOCK_REALTIME.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
            if exc.errno not in _IGNORED_RECV_ERRORS:
                log.debug("rtp recv error: %s", exc)
            return
        self.stats.received += 1
        try:
            self.handler(data, addr[:2])
        except Exception:  # one bad packet or call must not stop the reader of others
            log.exception("rtp handler failed")


def _recv_stamped(sock: socket.socket) -> tuple[bytes, list[tuple[int, int, bytes]], Address] | None:
    """One datagram with its ancillary data (the ``SO_TIMESTAMPNS`` stamp), or None: nothing queued, or an error
    that only this datagram had (logged when it is not one of the expected ones)."""
    try:
        data, ancillary, _flags, addr = sock.recvmsg(_MAX_DATAGRAM, _ANCILLARY_SPACE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        if exc.errno not in _IGNORED_RECV_ERRORS:
            log.debug("rtp recv error: %s", exc)
        return None
    return data, ancillary, addr[:2]


def _arrival(ancillary: list[tuple[int, int, bytes]], now: float, to_monotonic: float) -> float:
    """The kernel's receive stamp (CLOCK_REALTIME, moved onto the monotonic clock by ``to_monotonic``); ``now``
    without one. A wall-clock step between the stamp and now must not put it in the future."""
    if ancillary:
        stamp = ancillary[0][2]
        if len(stamp) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(stamp)
            return min(seconds + nanoseconds * 1e-9 + to_monotonic, now)
    return now


class _StampedReader:
    """:class:`_Reader` that also hands on when the kernel received the datagram (``SO_TIMESTAMPNS``)."""

    __slots__ = ("handler", "sock", "stats")

    def __init__(self, sock: socket.socket, handler: TimedDatagramHandler, stats: SocketStats) -> None:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock = sock
        self.handler = handler
        self.stats = stats

    def __call__(self) -> None:
        received = _recv_stamped(self.sock)
        if received is None:
            return
        data, ancillary, addr = received
        self.stats.received += 1
        now = time.monotonic()
        try:
            self.handler(data, addr, _arrival(ancillary, now, now - time.time()))
        except Exception:  # one bad packet or call must not stop the reader of others
            log.exception("rtp handler failed")


class RtpDrain:
    """Every call's RTP socket, read together once per media tick (Linux ``epoll``), with arrival times.

    A readiness callback per packet costs the event loop a wake-up and a callback dispatch for each of the
    50 packets per second of every call; here one ``epoll_wait`` per round finds every socket with data and
    one ``recvmsg`` per ready socket reads it. Reading at the tick adds no playout delay: a packet that
    arrived since the last tick is in the jitter buffer before this tick pops, as it was when read at once.
    The kernel's receive timestamp (``SO_TIMESTAMPNS``) stands for the arrival, so interarrival jitter and
    the jitter buffer's delay see the network, not the tick's phase.

    :meth:`drain` reads at most ``max_rounds`` datagrams per socket per call: a flooded socket costs a few
    reads per tick, and the rest waits in (or overflows) its kernel buffer instead of stalling the tick.
    """

    __slots__ = ("_entries", "_poller", "_stamp_keeper", "max_rounds", "rounds_capped")

    def __init__(self, *, max_rounds: int = 4) -> None:
        if not self.supported():
            raise OSError("RtpDrain needs Linux epoll and SO_TIMESTAMPNS")
        if max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self.max_rounds = max_rounds
        self.rounds_capped = 0  # drains that stopped with a socket still readable (flooded or backlogged)
        self._poller = select.epoll()
        self._entries: dict[int, tuple[socket.socket, TimedDatagramHandler, SocketStats]] = {}
        # Linux turns receive timestamping on for the whole host only while some socket asks for it, and the
        # first socket's request takes effect later, from a work queue; a datagram queued before that is
        # stamped when it is read. This socket asks for as long as the drain lives, so every call's socket
        # finds timestamping already on (and one call ending does not turn it off for the next).
        self._stamp_keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stamp_keeper.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)

    @staticmethod
    def supported() -> bool:
        return sys.platform.startswith("linux") and hasattr(select, "epoll")

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, sock: socket.socket, handler: TimedDatagramHandler, stats: SocketStats) -> None:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        fd = sock.fileno()
        self._poller.register(fd, select.EPOLLIN)
        self._entries[fd] = (sock, handler, stats)

    def remove(self, sock: socket.socket) -> None:
        """Stop reading ``sock``; call before closing it (its descriptor number is reused at once)."""
        fd = sock.fileno()
        if self._entries.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._poller.unregister(fd)

    def drain(self) -> int:
        """Read what every socket has queued and hand it on; returns how many datagrams were handed on."""
        entries = self._entries
        if not entries:
            return 0
        poll = self._poller.poll
        latest = time.monotonic()
        to_monotonic = latest - time.time()  # the kernel stamps CLOCK_REALTIME
        handed = 0
        for _ in range(self.max_rounds):
            ready = poll(0)
            if not ready:
                return handed
            for fd, _mask in ready:
                entry = entries.get(fd)
                if entry is None:
                    continue
                sock, handler, stats = entry
                received = _recv_stamped(sock)
                if received is None:
                    continue
                data, ancillary, addr = received
                stats.received += 1
                handed += 1
                try:
                    handler(data, addr, _arrival(ancillary, latest, to_monotonic))
                except Exception:  # one bad packet or call must not stop the others' audio
                    log.exception("rtp handler failed")
        if poll(0):
            self.rounds_capped += 1
        return handed

    def close(self) -> None:
        self._entries.clear()
        self._poller.close()
        self._stamp_keeper.close()


@dataclass(slots=True)
class RtpEndpoint:
    """One call's RTP + RTCP socket pair."""

    host: str
    port: int
    rtp_sock: socket.socket
    rtcp_sock: socket.socket
    stats: SocketStats = field(default_factory=SocketStats)
    _loop: asyncio.AbstractEventLoop | None = None
    _drain: RtpDrain | None = None
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

    def start_stamped(self, on_rtp: TimedDatagramHandler, on_rtcp: DatagramHandler) -> None:
        """As :meth:`start`, with each RTP datagram's kernel receive time (Linux; else the time it was read)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        reader: Callable[[], None]
        if RtpDrain.supported():
            reader = _StampedReader(self.rtp_sock, on_rtp, self.stats)
        else:
            reader = _Reader(self.rtp_sock, lambda data, addr: on_rtp(data, addr, time.monotonic()), self.stats)
        loop.add_reader(self.rtp_sock.fileno(), reader)
        loop.add_reader(self.rtcp_sock.fileno(), _Reader(self.rtcp_sock, on_rtcp, SocketStats()))

    def start_drained(self, drain: RtpDrain, on_rtp: TimedDatagramHandler, on_rtcp: DatagramHandler) -> None:
        """RTP read by ``drain`` (the media tick) with arrival times; RTCP read as in :meth:`start`."""
        self._loop = asyncio.get_running_loop()
        self._drain = drain
        drain.add(self.rtp_sock, on_rtp, self.stats)
        self._loop.add_reader(self.rtcp_sock.fileno(), _Reader(self.rtcp_sock, on_rtcp, SocketStats()))

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
        if self._drain is not None:
            self._drain.remove(self.rtp_sock)
            self._drain = None
        loop: Any = self._loop  # uvloop's remove_reader returns None where asyncio's returns a bool
        for sock in (self.rtp_sock, self.rtcp_sock):
            if loop is not None:
                loop.remove_reader(sock.fileno())
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
