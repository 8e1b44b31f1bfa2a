"""The hostile-input scenario, run as one process inside a private network namespace (see
tests/e2e/test_hostile_input.py, which starts it with `start_in_netns` and judges its JSON report).

Inside the namespace every address is made local and every packet on `lo` is recorded
(tests/e2e/hostile_wire.py), so whatever the gateway would have sent to 192.0.2.x, 2001:db8:: or a DNS
server shows up in the report instead of leaving the machine. The scenario:

1. starts `gateway run` (echo agent) and checks it answers OPTIONS;
2. a pjsua2 phone calls it and plays three spoken sentences while recording what comes back;
3. once the gateway has latched the phone's RTP, the hypothesis fuzz (tests/e2e/hostile_fuzz.py) throws
   mangled SIP at the UDP and TCP listeners and hostile RTP/RTCP at the call's ports, pinging after each
   example; then the crafted spot checks are sent and their answers recorded;
4. the unfinished TCP streams are closed and the gateway's open file descriptors must come back to what
   they were before the fuzz; the phone finishes its call;
5. a second phone call must work as the first;
6. last (it may make the gateway misdirect a packet, so it is judged apart): a request with a forged
   `received=` on its Via;
7. the metrics, the call records, the gateway's log and the packet record go into the report.

The report is printed as one line `@@hostile-result {json}`; the scenario itself asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.hostile_fuzz import FUZZ_SOURCES, PING_SOURCES, FuzzTarget, run_fuzz
from tests.e2e.hostile_sip import (
    SPOOFED_RECEIVED,
    SPOT_CHECKS,
    UNICODE_DIGIT_CHECKS,
    NamedConnectionCall,
    SipProbe,
    SpotCheck,
    options_ping,
    render_spot,
    status_of,
)
from tests.e2e.hostile_wire import Flow, LoopbackSniffer, claim_every_address, senders_to, sent_from
from tests.support.audio import align_and_correlate, read_wav, silence, speech_wav, with_silence, write_wav
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

__all__ = ["RESULT_PREFIX", "run"]

RESULT_PREFIX = "@@hostile-result "
SPOT_SOURCE = "127.0.0.4"
NAMED_SDP_SOURCE = "127.0.0.5"
SENTENCES = (
    "Hello, I would like to check my order status, please.",
    "My order number is four five six, and it was placed on Monday.",
    "Could you also tell me when the parcel will arrive at my door?",
)
LIFETIME_S = 110.0


def run(workdir: str, examples: int) -> None:
    """Entry point (via `python_call_argv`): run the scenario, print the report line."""
    # A SIGTERM from the test's process group ends the scenario through its finally blocks (and the
    # harness's atexit hook), so the gateway and phones it started are stopped by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = asyncio.run(_scenario(Path(workdir), examples))
    sys.stdout.write(RESULT_PREFIX + json.dumps(report) + "\n")
    sys.stdout.flush()


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _bound_udp_ports(low: int, high: int) -> list[int]:
    """UDP ports in [low, high] bound in this namespace (its own /proc/net/udp)."""
    ports = set()
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        port = int(line.split()[1].split(":")[1], 16)
        if low <= port <= high:
            ports.add(port)
    return sorted(ports)


async def _until(predicate: Any, *, within: float, what: str) -> Any:
    """Poll `predicate` (sync or async) until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + within
    delay = 0.02
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {within}s")
        # No event exists for another process's state (API, /proc): back off between looks.
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.25)


async def _calls(gateway: GatewayProcess) -> list[dict[str, Any]]:
    page = await gateway.api("GET", "/v1/calls", params={"limit": 500})
    return list(page["items"])


def _speech(workdir: Path) -> tuple[Path, Path]:
    """(three sentences with pauses, ~12 s; one sentence), 8 kHz mono, with tail silence for the echo."""
    parts = [read_wav(speech_wav(text, workdir / f"sentence{i}.wav")) for i, text in enumerate(SENTENCES)]
    pause = silence(0.4, 8000, 1)
    joined = np.concatenate([*(np.concatenate([p.samples, pause]) for p in parts), silence(1.5, 8000, 1)])
    long_wav = write_wav(workdir / "three_sentences.wav", joined, 8000)
    short_wav = write_wav(workdir / "one_sentence.wav", with_silence(parts[0], tail=1.5).samples, 8000)
    return long_wav, short_wav


def _correlation(sent: Path, heard: Path | None) -> dict[str, Any]:
    if heard is None or not heard.exists():
        return {"correlation": 0.0, "lag": 0, "error": "no recording"}
    played = read_wav(sent)
    got = read_wav(heard)
    # Jitter buffers (pjsua's adaptive one, and ours after an underrun on a busy machine) may move the
    # delay by a frame or two mid-call without losing audio; 100 ms windows confine each such slip to one
    # window, while a burst of played noise or a gap still costs the windows it falls in.
    correlation, lag = align_and_correlate(played.samples, got.samples, 8000, max_slip_seconds=0.15, window_seconds=0.1)
    return {"correlation": round(correlation, 4), "lag": lag, "heard_seconds": round(len(got.samples) / 8000, 2)}


def _spot_check(check: SpotCheck, uid: int, target: tuple[str, int]) -> dict[str, Any]:
    """Send one crafted request from SPOT_SOURCE and wait for its answer (1.5 s when none is right too)."""
    within = 1.5 if None in check.expected else 3.0
    if check.transport == "udp":
        probe = SipProbe(SPOT_SOURCE)
        try:
            data = render_spot(check, uid=uid, target=target, src=SPOT_SOURCE, sport=probe.port)
            probe.send(data, target)
            answer = probe.wait_for(f"z9hG4bKspot{uid}", within=within)
        finally:
            probe.close()
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stream:
            stream.bind((SPOT_SOURCE, 0))
            stream.settimeout(within)
            stream.connect(target)
            data = render_spot(check, uid=uid, target=target, src=SPOT_SOURCE, sport=stream.getsockname()[1])
            stream.sendall(data)
            try:
                answer = stream.recv(65536) or None
            except TimeoutError:
                answer = None
    status = None if answer is None else status_of(answer)
    return {
        "name": check.name,
        "transport": check.transport,
        "status": status,
        "expected": sorted(check.expected, key=lambda s: -1 if s is None else s),
        "ok": status in check.expected,
    }


async def _named_media_host_call(gateway: GatewayProcess, sip: tuple[str, int]) -> dict[str, Any]:
    """A PCMU call whose SDP names its media host; it runs until the gateway sent it 25 RTP packets."""
    call = NamedConnectionCall(NAMED_SDP_SOURCE, sip)
    result: dict[str, Any] = {"invite": await asyncio.to_thread(call.start)}
    if result["invite"] != 200:
        call.probe.close()
        return result

    async def sending() -> dict[str, Any] | None:
        for c in await _calls(gateway):
            if c["from"] == "hostile-sdp" and c["state"] == "active" and c["stats"]["rtp_packets_out"] >= 25:
                return c
        return None

    try:
        result["rtp_packets_out"] = (await _until(sending, within=5, what="RTP toward the named host"))["stats"][
            "rtp_packets_out"
        ]
    except TimeoutError as exc:
        result["error"] = str(exc)
    ping = SipProbe(NAMED_SDP_SOURCE)
    began = time.monotonic()
    result["ping"] = await asyncio.to_thread(options_ping, ping, sip, 800_000, within=5.0)
    result["ping_ms"] = round(1000 * (time.monotonic() - began), 2)
    ping.close()
    result["bye"] = await asyncio.to_thread(call.end)
    return result


def _spoofed_received_check(target: tuple[str, int], sniffer: LoopbackSniffer) -> dict[str, Any]:
    """A Via with a forged received=192.0.2.7: the answer must still come back to the sender."""
    before = len(sniffer.flows())
    result = _spot_check(SPOOFED_RECEIVED, 10_000, target)
    deadline = time.monotonic() + 2.0
    while not any(f.source == target for f in sniffer.flows()[before:]) and time.monotonic() < deadline:
        time.sleep(0.01)  # the sniffer thread records the gateway's answer, wherever it went, shortly
    flows = sniffer.flows()
    talkers = senders_to(flows, target, "udp") | senders_to(flows, target, "tcp")
    misdirected = [f.as_json() for f in flows[before:] if f.source == target and f.destination[0] not in talkers]
    return {**result, "misdirected": misdirected, "ok": result["ok"] and not misdirected}


def _wire_report(flows: list[Flow], *, sip: tuple[str, int], rtp: tuple[str, int], foreign_port: int) -> dict[str, Any]:
    talkers = senders_to(flows, sip, "udp") | senders_to(flows, sip, "tcp")
    from_sip = sent_from(flows, sip, "udp") + sent_from(flows, sip, "tcp")
    not_to_a_sender = sorted({f"{ip}:{port}" for (ip, port) in from_sip if ip not in talkers})
    off_loopback = [f.as_json() for f in flows if not f.destination[0].startswith("127.") and f.destination[0] != "::1"]
    phone_rtp = sum(
        1
        for f in flows
        if f.protocol == "udp" and f.destination == rtp and f.source[0] == "127.0.0.1" and f.source[1] != foreign_port
    )
    return {
        "sip_talkers": sorted(talkers),
        "sip_answers_not_to_a_sender": not_to_a_sender,
        "off_loopback": off_loopback[:20],
        "off_loopback_count": len(off_loopback),
        "dns_queries": sum(1 for f in flows if f.destination[1] == 53),
        "phone_rtp_packets": phone_rtp,
        "packets_seen": len(flows),
    }


def _metrics(text: str) -> dict[str, dict[str, float]]:
    """The samples of the counters this test judges, summed per `reason` / `kind` label (absent: none)."""
    out: dict[str, dict[str, float]] = {}
    sample = re.compile(r"^(gateway_(?:rtp_dropped|sip_rejected|sip_messages)_total)(?:\{([^}]*)\})? ([0-9.e+-]+)$")
    for line in text.splitlines():
        match = sample.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        key = labels.get("reason") or labels.get("kind") or ""
        family = out.setdefault(match.group(1), {})
        family[key] = family.get(key, 0.0) + float(match.group(3))
    return out


async def _scenario(workdir: Path, examples: int) -> dict[str, Any]:
    claim_every_address()
    sniffer = LoopbackSniffer()
    report: dict[str, Any] = {"stage": "start"}
    try:
        long_wav, short_wav = _speech(workdir)
        async with ProcessGroup(workdir / "logs") as procs:
            gateway = await start_gateway(procs, lifetime=LIFETIME_S)
            pid = gateway.process.pid
            sip = ("127.0.0.1", gateway.sip_port)
            warm = SipProbe(PING_SOURCES[0])
            report["warm_ping"] = await asyncio.to_thread(options_ping, warm, sip, 900_000, within=5.0)
            warm.close()
            report["fds_idle"] = _fd_count(pid)

            report["stage"] = "call"
            phone = PjsuaPhone(
                procs, workdir, name="pjsua-1", mode="caller", uri=gateway.sip_uri, play=long_wav,
                hangup_on_eof=True, max_seconds=60,
            )  # fmt: skip
            async with phone:
                await phone.wait_state("CONFIRMED", within=15)

                async def flowing() -> dict[str, Any] | None:
                    live = [c for c in await _calls(gateway) if c["state"] == "active"]
                    return live[0] if live and live[0]["stats"]["rtp_packets_in"] >= 25 else None

                call = await _until(flowing, within=10, what="RTP from the phone reaching the gateway")
                ports = _bound_udp_ports(*gateway.rtp_range)
                rtp = ("127.0.0.1", ports[0])
                report["call_id"], report["rtp_port"] = call["id"], rtp[1]
                report["fds_in_call"] = fds_in_call = _fd_count(pid)

                report["stage"] = "fuzz"
                began = time.monotonic()
                fuzz, foreign_port = await asyncio.to_thread(
                    run_fuzz, FuzzTarget(sip=sip, rtp=rtp), examples=examples, interval=0.02
                )
                report["fuzz"] = fuzz.as_json()
                report["fuzz_seconds"] = round(time.monotonic() - began, 2)
                report["spot_checks"] = [
                    await asyncio.to_thread(_spot_check, check, uid, sip) for uid, check in enumerate(SPOT_CHECKS)
                ]
                report["stage"] = "named-media-host"
                report["named_media_host"] = await _named_media_host_call(gateway, sip)
                report["phone_still_in_call"] = not any(e.name == "call_ended" for e in phone.events)
                with contextlib.suppress(TimeoutError):
                    await _until(lambda: _fd_count(pid) <= fds_in_call, within=10, what="fd count back")
                report["fds_after_fuzz"] = _fd_count(pid)

                report["stage"] = "call-end"
                await phone.wait_done(within=45)
            report["call1"] = _correlation(long_wav, phone.recording)
            report["call1_record"] = await gateway.api("GET", f"/v1/calls/{call['id']}")

            report["stage"] = "fresh-call"
            fresh = PjsuaPhone(
                procs, workdir, name="pjsua-2", mode="caller", uri=gateway.sip_uri, play=short_wav,
                hangup_on_eof=True, max_seconds=30,
            )  # fmt: skip
            async with fresh:
                await fresh.wait_state("CONFIRMED", within=15)
                await fresh.wait_done(within=30)
            report["call2"] = _correlation(short_wav, fresh.recording)

            report["stage"] = "records"
            flows = sniffer.flows()
            report["wire"] = _wire_report(flows, sip=sip, rtp=rtp, foreign_port=foreign_port)
            report["fuzz_sources_heard"] = sorted(set(FUZZ_SOURCES) & set(report["wire"]["sip_talkers"]))
            calls = await _calls(gateway)
            others = [c for c in calls if c["from"] not in ("pjsua", "hostile-sdp")]
            report["fuzz_calls"] = {
                "count": len(others),
                "answered": [c["id"] for c in others if c.get("answered")],
                "live": [c["id"] for c in others if c["state"] != "ended"],
                "end_reasons": sorted({c["end_reason"] for c in others}),
            }
            report["phone_calls"] = [
                {k: c[k] for k in ("id", "state", "end_reason", "codec")} for c in calls if c["from"] == "pjsua"
            ]
            async with gateway.client() as client:
                report["metrics"] = _metrics((await client.get("/metrics")).text)
            with contextlib.suppress(TimeoutError):  # the API's own connections close just after their answer
                await _until(lambda: _fd_count(pid) <= report["fds_idle"], within=5, what="fd count back to idle")
            report["fds_end"] = _fd_count(pid)

            report["stage"] = "unicode-digits"
            report["late_spot_checks"] = [
                await asyncio.to_thread(_spot_check, check, 20_000 + uid, sip)
                for uid, check in enumerate(UNICODE_DIGIT_CHECKS)
            ]

            report["stage"] = "spoofed-received"
            report["spoofed_received"] = await asyncio.to_thread(_spoofed_received_check, sip, sniffer)
            report["gateway_running"] = gateway.process.running
            log = gateway.process.output
            report["gateway_tracebacks"] = log.count("Traceback")
            report["gateway_error_lines"] = [line for line in log.splitlines() if " ERROR " in line][:10]
            report["logs"] = str(workdir / "logs")
            report["stage"] = "done"
    except Exception as exc:
        report["failure"] = f"{type(exc).__name__}: {exc}"
    finally:
        sniffer.close()
    return report
