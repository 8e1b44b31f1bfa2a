"""The per-call design the benchmark compares against: a call that fell behind reads its caller between ticks."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time

from bench._percall import PerCallEngine
from gateway.media.call import MediaCallConfig


def _config() -> MediaCallConfig:
    return MediaCallConfig(
        call_id="c1",
        codec="PCMU",
        payload_type=0,
        remote_rtp=("127.0.0.1", 9),
        ssrc=1234,
        initial_sequence=100,
        initial_timestamp=0,
    )


class _Arrivals(asyncio.DatagramProtocol):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.log.append("packet")


async def test_a_call_that_fell_behind_reads_the_packets_that_queued_before_its_catch_up_ticks() -> None:
    """One tick of the call is held up for 100 ms (five ticks) while the caller's packets queue in the kernel. The
    call's task must let the loop read them before it plays on: popping four more frames back to back first would
    run its jitter buffer dry and slip the caller's audio (aiortc-style tracks, which always sleep, never do)."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    transport, _ = await loop.create_datagram_endpoint(lambda: _Arrivals(log), local_addr=("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    ten_ticks = asyncio.Event()

    def tick(*args: object) -> None:
        log.append("tick")
        if log.count("tick") == 10:
            ten_ticks.set()
        if log.count("tick") == 3:  # the process descheduled mid-tick while the caller keeps sending
            for _ in range(5):
                sender.sendto(b"\x80" * 172, transport.get_extra_info("sockname"))
                time.sleep(0.02)
            log.append("held up")

    engine = PerCallEngine({})
    engine._call_tick = tick  # type: ignore[method-assign]  # the order of ticks and reads is the point
    try:
        engine.add_call(_config(), now=loop.time())
        await asyncio.wait_for(ten_ticks.wait(), timeout=2)
        after = log[log.index("held up") + 1 :]
        assert after.count("packet") == 5, log
        # The loop reads between catch-up ticks: never two ticks in a row while packets wait to be read.
        before_last_read = after[: len(after) - after[::-1].index("packet")]
        assert all(a != "tick" or b != "tick" for a, b in itertools.pairwise(before_last_read)), log
    finally:
        engine.remove_call("c1")
        transport.close()
        sender.close()
