"""The synchronous fuzz driver of the hostile-input test: throws hypothesis-generated SIP and RTP at a live
gateway and checks, after every example, that it still answers.

One hypothesis run (derandomized, no example database, no shrinking: a gateway that died cannot be
shrunk against) draws per example one mangled SIP request (tests/e2e/hostile_sip.py) and one to three
hostile RTP/RTCP datagrams (tests/e2e/hostile_rtp.py). Examples are paced at fixed times, so the hostile
traffic is spread over the phone's speech instead of arriving in one burst. Each example:

1. sends the SIP request from one of several fuzz source addresses (the gateway rate-limits per source IP,
   so one source would soon only test the limiter): UDP as one datagram, TCP cut into the drawn chunks
   and either finished (half-closed, the answer read to EOF) or left open and unfinished;
2. sends the RTP datagrams to the call's RTP or RTCP port from a foreign host or a foreign port;
3. pings the gateway with an OPTIONS from another address and fails the run unless 200 comes back.

Runs on a worker thread with blocking sockets (the caller's event loop keeps serving the phone).
"""

from __future__ import annotations

import itertools
import re
import socket
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.e2e.hostile_rtp import HostileRtp, hostile_rtp
from tests.e2e.hostile_sip import (
    VIA_PORTS,
    FuzzMessage,
    SipProbe,
    fuzz_messages,
    options_ping,
    status_of,
)

__all__ = ["FUZZ_SOURCES", "PING_SOURCES", "RTP_FOREIGN_HOST", "FuzzReport", "FuzzTarget", "run_fuzz"]

FUZZ_SOURCES = tuple(f"127.0.0.{n}" for n in range(20, 28))
PING_SOURCES = tuple(f"127.0.0.{n}" for n in range(30, 40))
RTP_FOREIGN_HOST = "127.0.0.3"
MAX_UNFINISHED_STREAMS = 16
_FUZZ_BRANCH = re.compile(rb"branch=z9hG4bKfz(\d+)x")
UDP_MAX = 65_000


@dataclass(frozen=True, kw_only=True)
class FuzzTarget:
    sip: tuple[str, int]
    rtp: tuple[str, int]

    @property
    def rtcp(self) -> tuple[str, int]:
        return self.rtp[0], self.rtp[1] + 1


@dataclass
class FuzzReport:
    examples: int = 0
    sip_sent: Counter[str] = field(default_factory=Counter)  # by transport
    sip_methods: Counter[str] = field(default_factory=Counter)
    mutations: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)  # status (first final answer per request)
    unanswered: int = 0
    tcp_resets: int = 0
    tcp_unfinished: int = 0
    rtp_sent: Counter[str] = field(default_factory=Counter)  # by kind
    rtp_to_rtp_port: int = 0
    rtp_valid_to_rtp_port: int = 0
    rtp_foreign_port: int = 0
    pings: int = 0
    ping_max_ms: float = 0.0
    error: str | None = None
    last_messages: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "examples": self.examples,
            "sip_sent": dict(self.sip_sent),
            "sip_methods": dict(self.sip_methods),
            "mutations": dict(self.mutations),
            "answers": dict(self.answers),
            "unanswered": self.unanswered,
            "tcp_resets": self.tcp_resets,
            "tcp_unfinished": self.tcp_unfinished,
            "rtp_sent": dict(self.rtp_sent),
            "rtp_to_rtp_port": self.rtp_to_rtp_port,
            "rtp_valid_to_rtp_port": self.rtp_valid_to_rtp_port,
            "rtp_foreign_port": self.rtp_foreign_port,
            "pings": self.pings,
            "ping_max_ms": round(self.ping_max_ms, 2),
            "error": self.error,
            "last_messages": self.last_messages,
        }


class _Fuzzer:
    def __init__(self, target: FuzzTarget, *, interval: float) -> None:
        self.target = target
        self.interval = interval
        self.report = FuzzReport()
        self.udp = {ip: SipProbe(ip) for ip in FUZZ_SOURCES}
        # Where answers to a Via without rport arrive (the source IP, the Via's port).
        self.via_listeners = [SipProbe(ip, port) for ip in FUZZ_SOURCES for port in VIA_PORTS]
        self.pings = [SipProbe(ip) for ip in PING_SOURCES]
        self.rtp_foreign_host = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp_foreign_host.bind((RTP_FOREIGN_HOST, 0))
        self.rtp_foreign_port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp_foreign_port.bind(("127.0.0.1", 0))
        self.open_streams: list[socket.socket] = []
        self.sent: set[int] = set()
        self.answered: dict[int, int] = {}  # uid -> first final status
        self.uids = itertools.count()
        self.started = time.monotonic()

    @property
    def foreign_rtp_port(self) -> int:
        return int(self.rtp_foreign_port.getsockname()[1])

    # -- one example ------------------------------------------------------------------------------

    def example(self, message: FuzzMessage, packets: list[HostileRtp]) -> None:
        uid = next(self.uids)
        report = self.report
        delay = self.started + uid * self.interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # pacing: the hostile traffic is spread over the call, not a settle-wait
        source = FUZZ_SOURCES[message.source]
        data = message.render(uid, source_ip=source, target=self.target.sip)
        report.examples += 1
        report.sip_sent[message.transport] += 1
        report.sip_methods[message.method] += 1
        report.mutations.update(message.mutations)
        self.sent.add(uid)
        report.last_messages = [*report.last_messages[-4:], f"{message.transport} {data[:400]!r}"]
        stream = None
        if message.transport == "udp":
            self.udp[source].send(data[:UDP_MAX], self.target.sip)
        else:
            stream = self._tcp_send(source, data, message.tcp_chunks)
        for packet in packets:
            self._send_rtp(packet)
        self._ping(uid, message)
        if stream is not None:
            if message.tcp_unfinished and len(self.open_streams) < MAX_UNFINISHED_STREAMS:
                self.open_streams.append(stream)
                report.tcp_unfinished += 1
            else:
                self._finish_stream(stream)

    def _tcp_send(self, source: str, data: bytes, chunks: tuple[int, ...]) -> socket.socket | None:
        stream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.settimeout(2.0)
        stream.bind((source, 0))
        stream.connect(self.target.sip)
        offset = 0
        try:
            for size in (*chunks, len(data)):
                piece = data[offset : offset + size]
                if not piece:
                    break
                stream.sendall(piece)
                offset += len(piece)
        except OSError:  # the gateway closed a stream that broke the size limits: what it should do
            self.report.tcp_resets += 1
            stream.close()
            return None
        return stream

    def _finish_stream(self, stream: socket.socket) -> None:
        """Half-close and read the answers to EOF: the gateway handles all we sent before it sees EOF."""
        received = b""
        try:
            stream.shutdown(socket.SHUT_WR)
            while chunk := stream.recv(65536):
                received += chunk
        except OSError:
            self.report.tcp_resets += 1
        finally:
            stream.close()
        for part in received.split(b"SIP/2.0 ")[1:]:
            self._record_answer(b"SIP/2.0 " + part)

    def _send_rtp(self, packet: HostileRtp) -> None:
        sock = self.rtp_foreign_host if packet.source == "foreign_host" else self.rtp_foreign_port
        destination = self.target.rtp if packet.port == "rtp" else self.target.rtcp
        try:
            sock.sendto(packet.data, destination)
        except OSError:
            return
        self.report.rtp_sent[packet.kind] += 1
        if packet.port == "rtp":
            self.report.rtp_to_rtp_port += 1
            self.report.rtp_valid_to_rtp_port += packet.parses
            self.report.rtp_foreign_port += packet.source == "foreign_port"

    def _ping(self, uid: int, message: FuzzMessage) -> None:
        began = time.monotonic()
        status = options_ping(self.pings[uid % len(self.pings)], self.target.sip, uid, within=3.0)
        self.report.pings += 1
        self.report.ping_max_ms = max(self.report.ping_max_ms, 1000 * (time.monotonic() - began))
        if status != 200:
            raise AssertionError(f"no 200 to OPTIONS (got {status}) after fuzz example {uid}: {message!r}")
        self._collect_udp()

    # -- answers ----------------------------------------------------------------------------------

    def _record_answer(self, data: bytes) -> None:
        """Note the first final answer per request, found by the Via branch every response copies."""
        match = _FUZZ_BRANCH.search(data)
        status = status_of(data)
        if match is not None and status is not None and status >= 200:
            self.answered.setdefault(int(match.group(1)), status)

    def _collect_udp(self) -> None:
        for probe in (*self.udp.values(), *self.via_listeners):
            for data in probe.drain():
                self._record_answer(data)

    def finish(self) -> FuzzReport:
        """Close the unfinished streams and the sockets; tally the answers."""
        for stream in self.open_streams:
            stream.close()
        self.open_streams.clear()
        self._collect_udp()
        report = self.report
        report.answers = Counter(str(status) for status in self.answered.values())
        report.unanswered = len(self.sent - set(self.answered))
        for probe in (*self.udp.values(), *self.via_listeners, *self.pings):
            probe.close()
        self.rtp_foreign_host.close()
        self.rtp_foreign_port.close()
        return report


def run_fuzz(target: FuzzTarget, *, examples: int, interval: float) -> tuple[FuzzReport, int]:
    """Run the hypothesis fuzz against `target`; (report, the foreign RTP source port used).

    A failing example (the gateway stopped answering) ends the run with `report.error` set."""
    fuzzer = _Fuzzer(target, interval=interval)
    foreign_port = fuzzer.foreign_rtp_port

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(message=fuzz_messages(sources=len(FUZZ_SOURCES)), packets=st.lists(hostile_rtp(), min_size=1, max_size=3))
    def fuzz_live_gateway(message: FuzzMessage, packets: list[HostileRtp]) -> None:
        fuzzer.example(message, packets)

    try:
        fuzz_live_gateway()
    except Exception as exc:  # reported to the test, which fails on it
        fuzzer.report.error = "".join(traceback.format_exception_only(exc)).strip()[-4000:]
    return fuzzer.finish(), foreign_port
