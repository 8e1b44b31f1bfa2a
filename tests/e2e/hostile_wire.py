"""Seeing every packet a gateway sends, inside a private network namespace (root).

For the hostile-input test, which runs the gateway, the phone and the fuzzer in one `unshare -n`
namespace. Plain, that namespace only has 127.0.0.0/8 and ::1: a send to 192.0.2.1 fails with
ENETUNREACH or EINVAL and leaves no trace, so "nothing went anywhere but back to the sender" could not be
checked. `claim_every_address()` adds local routes for 0.0.0.0/0 and ::/0 on `lo` (the AnyIP trick): every
address becomes an address of this namespace, so a misdirected response to 192.0.2.7, a TCP connect to
2001:db8::1 or a DNS query to the resolver in /etc/resolv.conf is delivered on `lo` (to nobody), where
`LoopbackSniffer` records it. Nothing can leave: the namespace has no other interface.

`LoopbackSniffer` is an AF_PACKET socket on `lo` that records each UDP/TCP packet once (the outgoing
copy) with its addressing, on a daemon thread, until `close()`.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Flow", "LoopbackSniffer", "claim_every_address", "parse_ip_packet", "senders_to", "sent_from"]

_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_PROTOCOLS = {6: "tcp", 17: "udp"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow:
    """One UDP or TCP packet's addressing."""

    protocol: str
    source: tuple[str, int]
    destination: tuple[str, int]
    size: int

    def as_json(self) -> dict[str, object]:
        return {"protocol": self.protocol, "source": list(self.source), "destination": list(self.destination)}


def parse_ip_packet(data: bytes) -> Flow | None:
    """Addressing of an IPv4/IPv6 UDP or TCP packet (no link header); None for anything else."""
    if not data:
        return None
    version = data[0] >> 4
    if version == 4 and len(data) >= 20:
        header = (data[0] & 0x0F) * 4
        number = data[9]
        src, dst = socket.inet_ntop(socket.AF_INET, data[12:16]), socket.inet_ntop(socket.AF_INET, data[16:20])
    elif version == 6 and len(data) >= 40:
        header = 40
        number = data[6]  # extension headers are not followed: UDP/TCP from sockets carry none here
        src, dst = socket.inet_ntop(socket.AF_INET6, data[8:24]), socket.inet_ntop(socket.AF_INET6, data[24:40])
    else:
        return None
    protocol = _PROTOCOLS.get(number)
    if protocol is None or len(data) < header + 4:
        return None
    sport, dport = struct.unpack_from("!HH", data, header)
    return Flow(protocol=protocol, source=(src, sport), destination=(dst, dport), size=len(data))


def claim_every_address() -> None:
    """Make every IPv4 and IPv6 address local to this namespace (see the module docstring)."""
    for argv in (
        ["ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo"],
        ["ip", "-6", "route", "add", "local", "::/0", "dev", "lo"],
    ):
        subprocess.run(argv, check=True, capture_output=True, timeout=10)


class LoopbackSniffer:
    """Every UDP/TCP packet sent on `lo`, recorded once (the outgoing copy)."""

    def __init__(self) -> None:
        self._flows: list[Flow] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(_ETH_P_ALL))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024 * 1024)
        self._sock.bind(("lo", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lo-sniffer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, address = self._sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if address[2] != _PACKET_OUTGOING:
                continue
            flow = parse_ip_packet(data)
            if flow is not None:
                with self._lock:
                    self._flows.append(flow)

    def flows(self) -> list[Flow]:
        with self._lock:
            return list(self._flows)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()


def senders_to(flows: Iterable[Flow], address: tuple[str, int], protocol: str) -> set[str]:
    """Source IPs of packets sent to `address`."""
    return {f.source[0] for f in flows if f.destination == address and f.protocol == protocol}


def sent_from(flows: Iterable[Flow], address: tuple[str, int], protocol: str) -> Counter[tuple[str, int]]:
    """Destinations of packets sent from `address`, with counts."""
    return Counter(f.destination for f in flows if f.source == address and f.protocol == protocol)
