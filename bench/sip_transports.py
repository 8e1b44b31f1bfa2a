"""``gateway bench sip-transports``: what SIP over TLS costs against UDP and TCP, in one process, on loopback.

Two real :class:`~gateway.transport.sip_transport.SipTransport` s (the worker's glue and SIP core) exchange OPTIONS
and their 200 OK, one at a time, over UDP, TCP and TLS in turn, repeated and interleaved; the TCP and TLS
connection is made once and reused, as a trunk's is. Reported per transport: the median round trip (both ends'
parse, core, framing and, for TLS, ``ssl.SSLObject`` records), and the ratio against UDP. Beside them, the
two costs TLS adds, measured on the same ``TlsSession`` the glue uses, in memory: one handshake (both sides:
TLS 1.3, ECDHE P-256, the ECDSA certificate verified with its name) and one 1,000-octet message encrypted and
decrypted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import OptionsAnswered, SipEvent
from gateway.transport.ports import free_port
from gateway.transport.self_signed import ensure_self_signed
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import SipTlsConfig, TlsContexts
from gateway.transport.tls_session import TlsSession

TRANSPORTS = ("udp", "tcp", "tls")


@dataclass(frozen=True, slots=True)
class TransportFigures:
    round_trip_us: dict[str, float]  # median OPTIONS round trip per transport (median of the repeats' medians)
    handshake_ms: float  # one TLS handshake, client and server, in memory
    record_us: float  # one 1,000-octet message encrypted and decrypted

    def ratio(self, transport: str) -> float:
        return self.round_trip_us[transport] / self.round_trip_us["udp"]


class _Pair:
    """A client and a server transport on loopback, both with UDP, TCP and TLS."""

    def __init__(self, tls: TlsContexts) -> None:
        self.answered = asyncio.Event()
        ports = [free_port("127.0.0.1") for _ in range(4)]
        self.server_port, self.server_tls_port = ports[2], ports[3]
        self.client_endpoint = SipEndpoint(self._config(ports[0], ports[1]))
        self.client = SipTransport(
            self.client_endpoint,
            host="127.0.0.1",
            port=ports[0],
            transports=TRANSPORTS,
            on_events=self._on_events,
            tls=tls,
            tls_port=ports[1],
        )
        self.server = SipTransport(
            SipEndpoint(self._config(ports[2], ports[3])),
            host="127.0.0.1",
            port=ports[2],
            transports=TRANSPORTS,
            on_events=lambda events: None,
            tls=tls,
            tls_port=ports[3],
        )

    @staticmethod
    def _config(port: int, tls_port: int) -> SipConfig:
        return SipConfig(local_port=port, tls_port=tls_port, transports=TRANSPORTS, rate_limit=None)

    def _on_events(self, events: list[SipEvent]) -> None:
        if any(isinstance(event, OptionsAnswered) for event in events):
            self.answered.set()

    async def round_trips(self, transport: str, count: int) -> list[float]:
        port = self.server_tls_port if transport == "tls" else self.server_port
        target = f"sip:bench@127.0.0.1:{port};transport={transport}"
        times: list[float] = []
        for _ in range(count + 5):  # the first few make the connection and warm the caches: left out
            self.answered.clear()
            started = time.perf_counter()
            self.client_endpoint.send_options(target, self.client.now())
            self.client.pump()
            await asyncio.wait_for(self.answered.wait(), timeout=5.0)
            times.append((time.perf_counter() - started) * 1e6)
        return times[5:]


def _session_costs(tls: TlsContexts, handshakes: int, records: int) -> tuple[float, float]:
    started = time.perf_counter()
    for _ in range(handshakes):
        client = TlsSession(tls.client, server_side=False, server_hostname="127.0.0.1")
        server = TlsSession(tls.server, server_side=True)  # type: ignore[arg-type]
        flight = client.start()
        while not (client.handshake_done and server.handshake_done):
            _, back = server.receive(flight)
            flight = client.receive(back)[1] if back else b""
    handshake_ms = (time.perf_counter() - started) * 1000 / handshakes
    message = b"x" * 1000
    started = time.perf_counter()
    for _ in range(records):
        server.receive(client.send(message))
    record_us = (time.perf_counter() - started) * 1e6 / records
    return handshake_ms, record_us


async def measure(*, repeats: int, count: int) -> TransportFigures:
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as directory:
        pair = ensure_self_signed(Path(directory), ("127.0.0.1",))
        tls = TlsContexts(SipTlsConfig(cert_file=pair.cert_file, key_file=pair.key_file, ca_file=pair.cert_file))
        transports = _Pair(tls)
        await transports.server.start()
        await transports.client.start()
        medians: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        try:
            for _ in range(repeats):
                for transport in TRANSPORTS:  # interleaved: the machine's noise falls on all three alike
                    medians[transport].append(statistics.median(await transports.round_trips(transport, count)))
        finally:
            await transports.client.aclose()
            await transports.server.aclose()
        handshake_ms, record_us = _session_costs(tls, handshakes=max(20, count // 10), records=count * 20)
    return TransportFigures(
        round_trip_us={t: statistics.median(v) for t, v in medians.items()},
        handshake_ms=handshake_ms,
        record_us=record_us,
    )


def run(*, repeats: int, count: int, json_output: bool) -> int:
    figures = asyncio.run(measure(repeats=repeats, count=count))
    if json_output:
        print(
            json.dumps(
                {
                    "round_trip_us": figures.round_trip_us,
                    "ratio_to_udp": {t: figures.ratio(t) for t in TRANSPORTS},
                    "tls_handshake_ms": figures.handshake_ms,
                    "tls_record_us": figures.record_us,
                    "repeats": repeats,
                    "count": count,
                }
            )
        )
        return 0
    print(f"OPTIONS round trips, one at a time, in one process (median of {repeats} medians of {count}):")
    for transport in TRANSPORTS:
        us = figures.round_trip_us[transport]
        print(f"  {transport:4} {us:8.0f} µs   {figures.ratio(transport):5.2f}x UDP")
    print(f"TLS handshake, both sides in memory:        {figures.handshake_ms:6.2f} ms")
    print(f"TLS record of 1,000 octets, out and in:     {figures.record_us:6.1f} µs")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    parser.add_argument("--count", type=int, default=400, help="round trips per transport per repetition")


def main(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.count < 10:
        raise SystemExit("gateway bench sip-transports: --repeats >= 1 and --count >= 10")
    return run(repeats=args.repeats, count=args.count, json_output=args.json)
