"""The SIP edge scenario, run as one process inside a private network namespace (tests/e2e/test_sip_edge.py
starts it with `start_in_netns` and judges its JSON report). In the namespace 127.0.0.0/8 is all local, so
the attacker, the real caller and the scanners each have their own source address:

1. `gateway run` with digest authentication on (user alice) and the edge's defaults but a shorter block;
2. from 127.0.0.2 a guessing loop answers each 401 with a wrong password as fast as the answers come, then
   blasts a few hundred more wrong answers without waiting: what was answered, and when answers stopped;
3. meanwhile a pjsua2 phone on 127.0.0.3 with the right password calls and speaks; its echo is correlated;
4. sipvicious from 127.0.0.1: `svmap` (its own User-Agent, dropped), and `svcrack` against alice with a
   word list whose right password comes after the first few guesses (with the scanner drop off for it, so
   the lockout is what stops it);
5. the metrics, the `security.blocked` events of the SSE stream and fail2ban's own reading of the log.

The report is printed as one line `@@edge-result {json}`; the scenario itself asserts nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway.sip.digest import authorization, parse_challenge
from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.audio import align_and_correlate, read_wav, speech_wav, with_silence, write_wav
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

__all__ = ["PASSWORD", "RESULT_PREFIX", "run"]

RESULT_PREFIX = "@@edge-result "
PASSWORD = "correct-horse-battery"
ATTACKER = "127.0.0.2"
CALLER = "127.0.0.3"
SCANNER = "127.0.0.1"
MAX_FAILURES = 5
BLAST = 400
LIFETIME_S = 100.0
REPO = Path(__file__).resolve().parents[2]


def run(workdir: str) -> None:
    """Entry point (via `python_call_argv`): run the scenario, print the report line."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = asyncio.run(_scenario(Path(workdir)))
    sys.stdout.write(RESULT_PREFIX + json.dumps(report) + "\n")
    sys.stdout.flush()


class Guesser:
    """One UDP source answering challenges with wrong passwords."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.host, self.port, self.target, self.n = host, self.sock.getsockname()[1], target, 0

    def invite(self, auth: str = "") -> bytes:
        self.n += 1
        uri = f"sip:agent@{self.target[0]}:{self.target[1]}"
        lines = [
            f"INVITE {uri} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.host}:{self.port};branch=z9hG4bKg{self.n};rport",
            "Max-Forwards: 70",
            f"From: <sip:alice@{self.host}>;tag=g{self.n}",
            f"To: <{uri}>",
            f"Call-ID: guess-{self.n}@{self.host}",
            "CSeq: 1 INVITE",
            f"Contact: <sip:alice@{self.host}:{self.port}>",
            "User-Agent: guesser/1.0",
        ]
        if auth:
            lines.append(f"Authorization: {auth}")
        return ("\r\n".join(lines) + "\r\nContent-Length: 0\r\n\r\n").encode()

    def answer_to(self, challenge: bytes, password: str) -> str:
        header = re.search(rb"^WWW-Authenticate: (.*)$", challenge, re.M | re.I)
        assert header is not None
        uri = f"sip:agent@{self.target[0]}:{self.target[1]}"
        return authorization(
            parse_challenge(header.group(1).decode().strip()),
            method="INVITE",
            uri=uri,
            username="alice",
            password=password,
            cnonce=f"c{self.n}",
            nc=1,
        )

    def exchange(self, data: bytes, within: float) -> bytes | None:
        self.sock.settimeout(within)
        self.sock.sendto(data, self.target)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            return None

    def guess_until_silenced(self, *, limit: int = 50) -> dict[str, Any]:
        """Challenge, wrong answer, again, until an answer gets no reply; what each step got."""
        wrong_answers: list[int | None] = []
        last_challenge: bytes | None = None
        began = time.monotonic()
        for i in range(limit):
            challenge = self.exchange(self.invite(), 1.0)
            if challenge is None:
                wrong_answers.append(None)
                break
            last_challenge = challenge
            reply = self.exchange(self.invite(self.answer_to(challenge, f"guess-{i}")), 1.0)
            wrong_answers.append(_status(reply))
            if reply is None:
                break
        elapsed = time.monotonic() - began
        # Now a blast of wrong answers without waiting (hundreds a second), each with a fresh Call-ID.
        replies = 0
        blast_began = time.monotonic()
        if last_challenge is not None:
            auth = self.answer_to(last_challenge, "blast")
            for _ in range(BLAST):
                self.sock.sendto(self.invite(auth), self.target)
            self.sock.settimeout(1.0)
            try:
                while True:
                    self.sock.recv(65536)
                    replies += 1
            except TimeoutError:
                pass
        blast_s = time.monotonic() - blast_began - 1.0
        self.sock.close()
        return {
            "wrong_answers": wrong_answers,
            "guess_seconds": round(elapsed, 3),
            "blast_sent": BLAST,
            "blast_rate_per_s": round(BLAST / max(blast_s, 1e-3)),
            "blast_replies": replies,
        }


def _status(data: bytes | None) -> int | None:
    if data is None:
        return None
    match = re.match(rb"SIP/2\.0 (\d{3})", data)
    return int(match.group(1)) if match else -1


def _correlation(sent: Path, heard: Path | None) -> dict[str, Any]:
    if heard is None or not heard.exists():
        return {"correlation": 0.0, "error": "no recording"}
    played, got = read_wav(sent), read_wav(heard)
    correlation, lag = align_and_correlate(played.samples, got.samples, 8000, max_slip_seconds=0.15, window_seconds=0.1)
    return {"correlation": round(correlation, 4), "lag": lag}


def _svcrack(port: int, words: Path) -> dict[str, Any]:
    argv = ["svcrack", "-u", "alice", "-d", str(words), "-p", str(port), "-m", "INVITE", "-t", "0.05"]
    try:
        out = subprocess.run(
            [*argv, "--maximumtime", "4", SCANNER],
            capture_output=True,
            text=True,
            timeout=40,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return {"returncode": None, "found": False, "output": f"svcrack ran longer than {exc.timeout}s"}
    text = out.stdout + out.stderr
    return {"returncode": out.returncode, "found": PASSWORD in text, "output": text[-1500:]}


def _svmap(port: int) -> dict[str, Any]:
    out = subprocess.run(
        ["svmap", "-p", str(port), "-t", "0.05", SCANNER],
        capture_output=True,
        text=True,
        timeout=40,
        stdin=subprocess.DEVNULL,
    )
    text = out.stdout + out.stderr
    return {"returncode": out.returncode, "found_device": f"{SCANNER}:{port}" in text, "output": text[-1500:]}


def _fail2ban(logs: list[Path], workdir: Path) -> dict[str, Any]:
    joined = workdir / "gateways.log"
    joined.write_text("".join(log.read_text(errors="replace") for log in logs))
    # `-o ip`: fail2ban prints the address it took from each matching line, one per line.
    out = subprocess.run(
        ["fail2ban-regex", "-o", "ip", str(joined), str(REPO / "deploy" / "fail2ban" / "voice-gateway.conf")],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    hosts = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return {"returncode": out.returncode, "matched": len(hosts), "hosts": sorted(set(hosts))}


async def _events(gateway: GatewayProcess, kind: str) -> list[dict[str, Any]]:
    """Every `kind` event still in the ring, read from the SSE stream from its start."""
    found: list[dict[str, Any]] = []
    async with (
        gateway.client() as client,
        client.stream("GET", "/v1/events", params={"last_event_id": 0}) as response,
    ):
        lines = response.aiter_lines()
        try:
            async with asyncio.timeout(2.0):
                event = ""
                async for line in lines:
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == kind:
                        found.append(json.loads(line[6:])["data"])
        except TimeoutError:
            pass  # the ring is replayed at once; after it only keepalives would come
    return found


async def _scenario(workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"stage": "start"}
    sentence = with_silence(
        read_wav(speech_wav("Hello, I am calling about my order, please.", workdir / "s.wav")), tail=1.5
    )
    played = write_wav(workdir / "played.wav", sentence.samples, 8000)
    words = workdir / "words.txt"
    words.write_text("\n".join([*(f"nope{i}" for i in range(12)), PASSWORD, "later"]) + "\n")
    async with ProcessGroup(workdir / "logs") as procs:
        env = {
            "GATEWAY_SIP_AUTH_USER": "alice",
            "GATEWAY_SIP_AUTH_PASSWORD": PASSWORD,
            "GATEWAY_SIP_AUTH_MAX_FAILURES": str(MAX_FAILURES),
            "GATEWAY_SIP_AUTH_BLOCK_S": "60",
        }
        gateway = await start_gateway(procs, env=env, lifetime=LIFETIME_S)
        target = ("127.0.0.1", gateway.sip_port)
        report["stage"] = "guessing"
        guessing = asyncio.create_task(asyncio.to_thread(Guesser(ATTACKER, target).guess_until_silenced))
        phone = PjsuaPhone(
            procs,
            workdir,
            mode="caller",
            uri=gateway.sip_uri,
            host=CALLER,
            auth=("alice", PASSWORD),
            play=played,
            hangup_on_eof=True,
            max_seconds=20,
        )
        await phone.start()
        report["guessing"] = await guessing
        report["stage"] = "call"
        report["phone_exit"] = await phone.wait_done(within=30)
        report["call"] = _correlation(played, phone.recording)
        report["call_states"] = [e.get("state") for e in phone.events if e.name == "call_state"]

        report["stage"] = "sipvicious"
        report["svmap"] = await asyncio.to_thread(_svmap, gateway.sip_port)
        report["svcrack_dropped"] = await asyncio.to_thread(_svcrack, gateway.sip_port, words)
        async with gateway.client() as client:
            report["metrics_first"] = _metrics((await client.get("/metrics")).text)
        await gateway.process.terminate()
        logs = [gateway.process.log_path]

        # The same attack with the scanner drop off: the lockout alone stops svcrack before the right word.
        report["stage"] = "svcrack-lockout"
        gateway = await start_gateway(
            procs, env={**env, "GATEWAY_SIP_DROP_USER_AGENTS": ""}, lifetime=LIFETIME_S, name="gateway-2"
        )
        report["svcrack_locked"] = await asyncio.to_thread(_svcrack, gateway.sip_port, words)
        async with gateway.client() as client:
            report["metrics"] = _metrics((await client.get("/metrics")).text)
        report["blocked_events"] = await _events(gateway, "security.blocked")
        await gateway.process.terminate()
        logs.append(gateway.process.log_path)
        report["fail2ban"] = await asyncio.to_thread(_fail2ban, logs, workdir)
        report["stage"] = "done"
    return report


def _metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(
            r'^gateway_sip_(?:rejected_total\{.*reason="(\w+)".*\}|(blocks)_total\{.*\}) ([0-9.e+-]+)$', line
        )
        if match:
            key = match.group(1) or match.group(2)
            out[key] = out.get(key, 0.0) + float(match.group(3))
    return out
