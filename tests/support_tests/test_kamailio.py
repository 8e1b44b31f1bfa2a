"""Kamailio with deploy/kamailio/dispatcher.cfg: config checks, OPTIONS probing, dispatch and failover."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.kamailio import (
    KamailioConfigError,
    KamailioDispatcher,
    KamailioRegistrar,
    parse_dispatcher_list,
    parse_ul_dump,
)
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]


@pytest.fixture(autouse=True)
def _kamailio() -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")


class RejectingWorker(asyncio.DatagramProtocol):
    """A fake worker that is healthy for OPTIONS (200) but fails every INVITE with 503."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        head = data.split(b"\r\n\r\n", 1)[0].decode("utf-8", "replace").split("\r\n")
        method = head[0].split(" ", 1)[0]
        self.methods.append(method)
        if method == "ACK" or head[0].startswith("SIP/2.0"):
            return
        keep = [h for h in head[1:] if h.split(":", 1)[0].strip().lower() in ("via", "from", "to", "call-id", "cseq")]
        status = "200 OK" if method == "OPTIONS" else "503 Service Unavailable"
        keep = [h + ";tag=rej1" if h.lower().startswith("to:") and "tag=" not in h else h for h in keep]
        reply = "\r\n".join([f"SIP/2.0 {status}", *keep, "Content-Length: 0", "", ""])
        assert self.transport is not None
        self.transport.sendto(reply.encode(), addr)


def test_parse_dispatcher_list() -> None:
    text = """{
\tNRSETS: 1
\tRECORDS: {
\t\tSET: {
\t\t\tID: 1
\t\t\tTARGETS: {
\t\t\t\tDEST: {
\t\t\t\t\tURI: sip:127.0.0.1:5070
\t\t\t\t\tFLAGS: IP
\t\t\t\t\tPRIORITY: 0
\t\t\t\t}
\t\t\t\tDEST: {
\t\t\t\t\tURI: sip:127.0.0.1:5072
\t\t\t\t\tFLAGS: AP
\t\t\t\t}
\t\t\t}
\t\t}
\t}
}"""
    targets = parse_dispatcher_list(text)
    assert [(t.set_id, t.uri, t.flags) for t in targets] == [
        (1, "sip:127.0.0.1:5070", "IP"),
        (1, "sip:127.0.0.1:5072", "AP"),
    ]
    assert targets[0].inactive and targets[1].active


UL_DUMP = """{
	Domains: {
		Domain: {
			Domain: location
			AoRs: {
				Info: {
					AoR: +15550100
					Contacts: {
						Contact: {
							Address: sip:gateway@127.0.0.1:15200
							Expires: 10
							Call-ID: cid1@127.0.0.1
							CSeq: 2
							Instance: <urn:uuid:00000000-0000-0000-0000-000000000001>
						}
						Contact: {
							Address: sip:gateway@127.0.0.1:15202
							Expires: permanent
							Call-ID: cid2
							CSeq: 7
							Instance: [not set]
						}
					}
				}
				Info: {
					AoR: alice
					Contacts: {
						Contact: {
							Address: sip:alice@127.0.0.1:5999
							Expires: 3
							Call-ID: a
							CSeq: 1
						}
					}
				}
			}
		}
	}
}"""


def test_parse_ul_dump() -> None:
    first, second, third = parse_ul_dump(UL_DUMP)
    assert (first.aor, first.address, first.expires, first.call_id, first.cseq) == (
        "+15550100",
        "sip:gateway@127.0.0.1:15200",
        10,
        "cid1@127.0.0.1",
        2,
    )
    assert first.instance == "<urn:uuid:00000000-0000-0000-0000-000000000001>"
    assert (second.expires, second.instance, second.cseq) == (None, None, 7)
    assert (third.aor, third.address) == ("alice", "sip:alice@127.0.0.1:5999")
    assert parse_ul_dump("{\n\tDomains: {\n\t}\n}") == []


def test_registrar_config_validates(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    registrar = KamailioRegistrar(peer_procs, tmp_path, auth_password="pw", min_expires=2, max_expires=5)
    assert "config file ok" in registrar.check_config()


def test_shipped_config_validates_and_a_broken_one_does_not(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    good = KamailioDispatcher(peer_procs, tmp_path, workers=["sip:127.0.0.1:5070"])
    assert "config file ok" in good.check_config()
    broken_cfg = tmp_path / "broken.cfg"
    broken_cfg.write_text(good.config.read_text().replace("route(DISPATCH);\n}", "route(DISPATCH)\n}", 1))
    broken = KamailioDispatcher(peer_procs, tmp_path, workers=["sip:127.0.0.1:5070"], config=broken_cfg, name="broken")
    with pytest.raises(KamailioConfigError):
        broken.check_config()


async def test_probing_marks_a_dead_worker_down_and_calls_reach_the_live_one(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    callee = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="worker", user="agent", auto_answer=True, tail_silence=8
    )
    dead = f"sip:127.0.0.1:{free_ports(1)[0]}"
    async with callee:
        live = f"sip:127.0.0.1:{callee.sip_port}"
        async with KamailioDispatcher(peer_procs, tmp_path, workers=[dead, live]) as lb:
            await lb.wait_target(dead, active=False, within=15)
            assert (await lb.wait_target(live, active=True, within=5)).active
            caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="caller")
            async with caller:
                caller_target = lb.sip_uri("agent")
                await caller.dial(caller_target)
                await callee.wait_established(within=10)
                await caller.wait_established(within=5)
                # The caller hangs up at the end of its WAV; the BYE follows the Record-Route via Kamailio.
                await caller.wait_closed(within=15)
                await callee.wait_closed(within=10)
    assert lb.process is not None
    assert f"INVITE {caller_target} -> worker {live}" in lb.process.output
    sent = read_wav(speech_8k)
    correlation, _ = align_and_correlate(sent.samples, read_wav(callee.last_recording().decoded).samples, 8000)
    assert correlation >= 0.9, "media must flow directly between caller and worker"


async def test_failure_route_moves_an_invite_from_a_503_worker_to_the_next(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    loop = asyncio.get_running_loop()
    rejecting = RejectingWorker()
    reject_port = free_ports(1)[0]
    transport, _ = await loop.create_datagram_endpoint(lambda: rejecting, local_addr=("127.0.0.1", reject_port))
    try:
        callee = BaresipPhone(
            peer_procs, tmp_path, source_wav=speech_8k, name="worker", user="agent", auto_answer=True, tail_silence=8
        )
        async with callee:
            workers = [f"sip:127.0.0.1:{reject_port}", f"sip:127.0.0.1:{callee.sip_port}"]
            async with KamailioDispatcher(peer_procs, tmp_path, workers=workers, algorithm=4) as lb:
                for worker in workers:
                    await lb.wait_target(worker, active=True, within=10)
                caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="caller")
                async with caller:
                    # Round robin over two active workers: one of two calls is first offered to the 503 one.
                    for attempt in (1, 2):
                        await caller.dial(lb.sip_uri("agent"))
                        await callee.wait_established(within=10, nth=attempt)
                        await caller.wait_closed(within=15, nth=attempt)
                        await callee.wait_closed(within=10, nth=attempt)
                assert "INVITE" in rejecting.methods
                assert lb.process is not None
                await lb.process.wait_for_output(r"failed \(503\) for INVITE: marking it down", within=5)
    finally:
        transport.close()


async def test_call_load_distribution_sends_a_new_call_to_the_worker_with_fewer_calls(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    """The shipped default (algorithm 10): with a long call on one worker, every short call that follows goes
    to the other; round robin would send the second of them back to the busy worker."""
    require_binary("baresip", package="baresip baresip-core")
    workers = [
        BaresipPhone(
            peer_procs,
            tmp_path,
            source_wav=speech_8k,
            name=f"worker{i}",
            user="agent",
            auto_answer=True,
            tail_silence=20,
        )
        for i in (1, 2)
    ]
    long_caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="long", user="long", tail_silence=14)
    short_caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="short", user="short")
    phones = (*workers, long_caller, short_caller)
    await asyncio.gather(*(phone.start() for phone in phones))
    try:
        uris = [f"sip:127.0.0.1:{worker.sip_port}" for worker in workers]
        async with KamailioDispatcher(peer_procs, tmp_path, workers=uris) as lb:
            for uri in uris:
                await lb.wait_target(uri, active=True, within=10)
            assert lb.process is not None
            await long_caller.dial(lb.sip_uri("agent"))
            await long_caller.wait_established(within=10)
            busy = await _routed(lb, "long")
            for attempt in (1, 2):
                await short_caller.dial(lb.sip_uri("agent"))
                await short_caller.wait_established(within=10, nth=attempt)
                assert await _routed(lb, "short", nth=attempt) != busy
                await short_caller.wait_closed(within=15, nth=attempt)
            assert not [e for e in long_caller.events if e.type == "CALL_CLOSED"]  # still up all along
    finally:
        await asyncio.gather(*(phone.aclose() for phone in phones))


async def _routed(lb: KamailioDispatcher, user: str, *, nth: int = 1) -> str:
    """The worker Kamailio sent the nth INVITE from ``user`` to (its `INVITE ... -> worker <uri>` log line)."""
    import re

    assert lb.process is not None
    pattern = re.compile(rf"INVITE sip:agent@\S+ -> worker (\S+) \(from {user}\)")
    for _ in range(50):
        found = pattern.findall(lb.process.output)
        if len(found) >= nth:
            return str(found[nth - 1])
        await asyncio.sleep(0.1)
    raise AssertionError(f"no INVITE from {user} routed (nth {nth}):\n{lb.process.output[-2000:]}")


async def test_the_optional_rate_limit_blocks_a_flooding_source_and_not_the_others(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    import socket

    async with KamailioDispatcher(
        peer_procs, tmp_path, workers=[f"sip:127.0.0.1:{free_ports(1)[0]}"], rate_limit=(20, 2)
    ) as lb:
        flooder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        calm = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        flooder.bind(("127.0.0.1", 0))
        calm.bind(("127.0.0.2", 0))  # pike limits by source address
        try:
            for i in range(200):
                flooder.sendto(_options_to_kamailio(lb.port, flooder, f"flood{i}"), ("127.0.0.1", lb.port))
            answered = await asyncio.to_thread(_count_answers, flooder, within=1.5)
            assert 0 < answered <= 60, answered  # about the first 20 per 2 s window, then blocked
            calm.sendto(_options_to_kamailio(lb.port, calm, "calm1"), ("127.0.0.1", lb.port))
            assert await asyncio.to_thread(_count_answers, calm, within=3, stop_after=1) == 1
        finally:
            flooder.close()
            calm.close()
        assert lb.process is not None
        await lb.process.wait_for_output(r"rate limit: dropping OPTIONS from 127\.0\.0\.1", within=5)


def _options_to_kamailio(port: int, sock: object, tag: str) -> bytes:
    import socket

    assert isinstance(sock, socket.socket)
    ip, sport = sock.getsockname()
    return (
        f"OPTIONS sip:127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {ip}:{sport};branch=z9hG4bK{tag};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:probe@{ip}>;tag={tag}\r\n"
        f"To: <sip:127.0.0.1:{port}>\r\n"
        f"Call-ID: {tag}@{ip}\r\n"
        "CSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


def _count_answers(sock: object, *, within: float, stop_after: int | None = None) -> int:
    import socket
    import time

    assert isinstance(sock, socket.socket)
    deadline = time.monotonic() + within
    count = 0
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if data.startswith(b"SIP/2.0 200"):
            count += 1
            if stop_after is not None and count >= stop_after:
                break
    return count
