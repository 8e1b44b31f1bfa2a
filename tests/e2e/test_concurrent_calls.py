"""Twenty real phones call one ``gateway run`` at once; every one hears itself, and afterwards the gateway
holds no RTP port, socket or call it did not hold before.

The phones are pjsua2 processes (a few % of a core each). baresip 1.0 headless plays received audio into
ALSA's null device, which has no clock, so each baresip in a call spins a core: twenty of them would measure
the scheduler of a 2-core machine, not the gateway. baresip calls are covered one at a time elsewhere.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.audio import align_and_correlate, read_wav
from tests.support.machine import MachineWatch, assert_quality
from tests.support.peers import require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup, port_is_bound

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

CALLS = 20
#: what any machine guarantees: each call's echo is recognizably the speech it sent (an echo of another call,
#: of silence or of noise correlates far below this)
OWN_SPEECH = 0.6


def _sockets(pid: int) -> Counter[str]:
    """The process's sockets by kind: ``udp``, ``tcp:<state>`` (``tcp:0A`` is a listener), ``unix`` or ``other``."""
    kinds: dict[str, str] = {}
    for table in ("udp", "udp6", "tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            kinds[fields[9]] = "udp" if table.startswith("udp") else f"tcp:{fields[3]}"
    unix = {line.split()[6] for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]}
    count: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[len("socket:[") : -1]
            count[kinds.get(inode) or ("unix" if inode in unix else "other")] += 1
    return count


async def _items(gateway: GatewayProcess, state: str) -> list[dict]:
    page = await gateway.api("GET", "/v1/calls", params={"state": state, "limit": 100})
    return page["items"] if isinstance(page, dict) else page


async def _metrics(gateway: GatewayProcess) -> str:
    async with gateway.client() as client:
        response = await client.get("/metrics")
        response.raise_for_status()
        return response.text


async def test_twenty_concurrent_calls_echo_and_leave_nothing_behind(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await start_gateway(peer_procs)
    pid = gateway.process.pid
    sockets_before = _sockets(pid)
    sent = read_wav(speech_8k).samples

    async def call(index: int) -> float:
        # Calls arrive 100 ms apart, like a trunk's arrival rate; all twenty overlap for several seconds.
        await asyncio.sleep(index * 0.1)
        phone = PjsuaPhone(
            peer_procs,
            tmp_path / f"p{index}",
            mode="caller",
            name=f"pjsua{index}",
            uri=gateway.sip_uri,
            play=speech_8k,
            hangup_after=6.0,
        )
        async with phone:
            await phone.wait_state("CONFIRMED", within=20)
            await phone.wait_done(within=60)
        # pjsua2's adaptive jitter buffer may move the delay by a frame or two mid-call: allow that slip
        return align_and_correlate(sent, read_wav(phone.recording).samples, 8000, max_slip_seconds=0.15)[0]

    watch = MachineWatch.start()
    results = await asyncio.gather(*(call(i) for i in range(CALLS)))
    machine = watch.stop()
    ended = await _items(gateway, "ended")
    stats = [(c["stats"]["rtp_lost"], c["stats"]["late"], round(c["stats"]["jitter_ms"], 1)) for c in ended]
    ticks = [line for line in (await _metrics(gateway)).splitlines() if "tick_overruns_total{" in line]
    detail = f"correlations {[round(r, 3) for r in results]}; {ticks}; (lost, late, jitter) {stats}"
    # Any machine: every call's echo is its own speech.
    assert min(results) >= OWN_SPEECH, detail
    # The quality bar: every call clearly the speech it sent, the middle call as clean as an unloaded call.
    # Twenty pjsua2 processes and the gateway share this host's cores; when other work takes them, the gateway
    # counts tick overruns and calls lose a frame or two of their echo (one run here read 0.826 with 20 overruns
    # while other work loaded both cores, and passed alone). Such a miss is reported as the machine's (an xfail
    # with its numbers, tests/support/machine.py, ADR 0023), a miss on a quiet machine fails.
    assert_quality(min(results) >= 0.85 and sorted(results)[CALLS // 2] >= 0.92, detail, machine)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(await _items(gateway, "ended")) < CALLS or await _items(gateway, "active"):
        assert loop.time() < deadline, "the calls were not all reported ended"
        await asyncio.sleep(0.2)
    low, high = gateway.rtp_range
    assert not [port for port in range(low, high, 2) if port_is_bound(port, kind="udp")]
    # No RTP or SIP socket is left; an API connection the test just closed may take the server a moment to see.
    assert _sockets(pid)["udp"] <= sockets_before["udp"], (sockets_before, _sockets(pid))
    deadline = loop.time() + 5
    while _sockets(pid).total() > sockets_before.total():
        assert loop.time() < deadline, (sockets_before, _sockets(pid))
        await asyncio.sleep(0.05)
    active = [line for line in (await _metrics(gateway)).splitlines() if line.startswith("gateway_active_calls{")]
    assert active and all(line.rstrip().endswith(" 0.0") for line in active), active
