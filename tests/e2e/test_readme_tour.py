"""The README's five-minute tour, step 2, run as written: its shell block calls a gateway with baresip.

The block is taken from README.md and run by bash with only its addresses moved: the gateway's SIP port for
5060, a free port for the phone's 5062, a directory of this test's for /tmp, and a shorter run (``-t``). If
the README's commands stop working (a module baresip needs, a flag it does not know), this fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import start_gateway
from tests.support.audio import align_and_correlate, read_wav
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_sip_phone_block() -> str:
    """The shell block of the tour's "Call it from a SIP phone" step, de-indented from its list item."""
    text = README.read_text()
    step = text.index("**Call it from a SIP phone**")
    match = re.compile(r"\n( *)```sh\n(.*?)\n\1```", re.S).search(text, step)
    assert match is not None, "the SIP phone step of the README's tour has no ```sh block"
    indent = len(match.group(1))
    return "\n".join(line[indent:] for line in match.group(2).splitlines()) + "\n"


def test_the_tour_block_names_the_addresses_this_test_moves() -> None:
    block = tour_sip_phone_block()
    for fixed in ("127.0.0.1:5060", "127.0.0.1:5062", "/tmp/phone", "/tmp/hello", "-t 20"):
        assert fixed in block, f"{fixed!r} is no longer in the README's tour block: update this test with it"


async def test_the_readme_tour_call_echoes_the_speech(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    gateway = await start_gateway(peer_procs)
    (phone_port,) = free_ports(1)
    block = (
        tour_sip_phone_block()
        .replace("127.0.0.1:5060", f"127.0.0.1:{gateway.sip_port}")
        .replace("127.0.0.1:5062", f"127.0.0.1:{phone_port}")
        .replace("/tmp/", f"{tmp_path}/")
        .replace("-t 20", "-t 8")  # the WAV lasts about 4.3 s; baresip quits after -t seconds
    )
    script = tmp_path / "tour.sh"
    script.write_text("set -eu\n" + block)
    run = await peer_procs.start("tour", ["bash", str(script)], lifetime=60)
    assert await run.wait(within=45) == 0, run.output[-2000:]
    assert "Call established" in run.output, run.output[-2000:]

    heard = sorted((tmp_path / "phone").glob("*-dec.wav"))
    assert len(heard) == 1, f"baresip wrote {heard}"
    sent = read_wav(tmp_path / "hello_8k.wav")
    correlation, lag = align_and_correlate(sent.samples, read_wav(heard[0]).samples, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, f"echo correlation {correlation:.3f} (lag {lag})"
    calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    assert [call["end_reason"] for call in calls["items"]] == ["caller_hangup"]
