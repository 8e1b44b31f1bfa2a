"""PJSIP (pjsua2) as a SIP phone for end-to-end tests, run as a subprocess (tests/support/pjsua_phone.py).

pjsua2 can abort a process while tearing down a finished call, so the phone lives in its own process,
which is started with its whole call plan (play this WAV, record, DTMF at these times, hang up after N
seconds or at the end of the WAV) and reports JSON events on stdout. `PjsuaPhone` starts it through a
`ProcessGroup`, collects the events and waits for them with deadlines.

Facts worth knowing: PJSIP offers telephone-event with payload type 120 (compile-time in this build);
it has no Opus; its conference bridge runs at `clock_rate` (8 kHz here), which is also the rate of the
recorded WAV.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

__all__ = ["PJSUA_TELEPHONE_EVENT_PT", "PjsuaEvent", "PjsuaPhone"]

HELPER = Path(__file__).with_name("pjsua_phone.py")
PREFIX = "@@pjsua "
PJSUA_TELEPHONE_EVENT_PT = 120


@dataclass(frozen=True, kw_only=True)
class PjsuaEvent:
    """One line reported by the helper: `name` (ready, call_state, media_active, dtmf_sent, ...)."""

    name: str
    t: float
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.fields.get(key)


class PjsuaPhone:
    """One pjsua2 phone process. Caller: `uri` is dialled at start. Callee: answers the first call."""

    def __init__(
        self,
        procs: ProcessGroup,
        workdir: Path,
        *,
        mode: str,
        uri: str | None = None,
        name: str = "pjsua",
        user: str = "pjsua",
        play: Path | None = None,
        record: bool = True,
        dtmf: Sequence[tuple[float, str]] = (),
        hangup_after: float | None = None,
        hangup_on_eof: bool = False,
        hold_at: float | None = None,
        unhold_at: float | None = None,
        xfer_to: str | None = None,
        xfer_at: float | None = None,
        max_seconds: float = 30.0,
        codecs: Sequence[str] = ("PCMU", "PCMA"),
        clock_rate: int = 8000,
        srtp: str = "disabled",
        srtp_secure_signaling: int = 0,
        tls: bool = False,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_verify_server: bool = False,
        headers: Sequence[tuple[str, str]] = (),
        display_name: str = "",
        host: str = "127.0.0.1",
        auth: tuple[str, str] | None = None,
        early_media_s: float = 0.0,
        answer_code: int = 200,
        follow_transfer: bool = False,
        prack: str = "off",
    ) -> None:
        """``srtp``: SDES SRTP of the media, ``disabled``, ``optional`` (RTP/AVP with a=crypto) or ``mandatory``
        (RTP/SAVP); separate from the SIP transport, so the two combine. ``srtp_secure_signaling=1``: keys only over
        TLS signalling (RFC 4568 §8.3 asks for a secure hop).

        ``tls``: PJSIP's TLS transport too, on ``tls_port`` (a ``uri`` with ``;transport=tls`` or ``sips:`` takes
        it), serving ``tls_cert``/``tls_key``; ``tls_verify_server`` checks the server's chain against ``tls_ca``
        and its name against the host dialled.

        ``headers``: (name, value) pairs a caller adds to its INVITE; ``display_name``: the name in its From.
        ``host``: the loopback address it binds (another source than 127.0.0.1); ``auth``: (user, password)
        answering a digest challenge. ``follow_transfer``: go on with the new call of a REFER it takes, or of an
        INVITE with Replaces of its call. ``early_media_s``: a callee answers 183 with SDP (early media, its player
        running) and sends the 200 that much later. ``prack``: RFC 3262 100rel, ``off``, ``optional`` (Supported)
        or ``mandatory`` (a caller's INVITE says Require: 100rel; it PRACKs reliable 18x)."""
        if mode not in ("caller", "callee"):
            raise ValueError(f"mode must be caller or callee, not {mode!r}")
        if mode == "caller" and not uri:
            raise ValueError("a caller needs the uri to dial")
        self.name = name
        self.mode = mode
        self.user = user
        self.workdir = Path(workdir) / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.recording: Path | None = self.workdir / "heard.wav" if record else None
        ports = free_ports(2)
        self.sip_port = ports[0]
        self.tls_port = ports[1] if tls else None
        self.rtp_port = free_ports(24)[0]
        self.max_seconds = max_seconds
        self.events: list[PjsuaEvent] = []
        self.process: ManagedProcess | None = None
        self._procs = procs
        self._changed = asyncio.Event()
        self._argv = [
            sys.executable,
            str(HELPER),
            f"--mode={mode}",
            f"--user={user}",
            f"--port={self.sip_port}",
            f"--rtp-port={self.rtp_port}",
            f"--max-seconds={max_seconds}",
            f"--codecs={','.join(codecs)}",
            f"--clock-rate={clock_rate}",
            f"--log={self.pjsip_log}",
            f"--srtp={srtp}",
            f"--srtp-secure-signaling={srtp_secure_signaling}",
            f"--host={host}",
            f"--answer-code={answer_code}",
            f"--prack={prack}",
        ]
        if auth is not None:
            self._argv += [f"--auth-user={auth[0]}", f"--auth-password={auth[1]}"]
        if self.tls_port is not None:
            self._argv.append(f"--tls-port={self.tls_port}")
            for flag, value in (("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
                if value is not None:
                    self._argv.append(f"{flag}={value}")
            if tls_verify_server:
                self._argv.append("--tls-verify-server")
        if uri:
            self._argv.append(f"--uri={uri}")
        self._argv += [f"--header={name}: {value}" for name, value in headers]
        if display_name:
            self._argv.append(f"--display-name={display_name}")
        if play is not None:
            self._argv.append(f"--play={play}")
        if self.recording is not None:
            self._argv.append(f"--record={self.recording}")
        if dtmf:
            self._argv.append("--dtmf=" + ",".join(f"{digits}@{at}" for at, digits in dtmf))
        if hangup_after is not None:
            self._argv.append(f"--hangup-after={hangup_after}")
        if hold_at is not None:
            self._argv.append(f"--hold-at={hold_at}")
        if unhold_at is not None:
            self._argv.append(f"--unhold-at={unhold_at}")
        if hangup_on_eof:
            self._argv.append("--hangup-on-eof")
        if early_media_s:
            self._argv.append(f"--early-media-s={early_media_s}")
        if follow_transfer:
            self._argv.append("--follow-transfer")
        if xfer_to is not None:  # a blind transfer (REFER) of the far end, ``xfer_at`` s after the call is up
            self._argv += [f"--xfer-to={xfer_to}", f"--xfer-at={xfer_at or 0.0}"]

    @property
    def sip_uri(self) -> str:
        return f"sip:{self.user}@127.0.0.1:{self.sip_port}"

    @property
    def pjsip_log(self) -> Path:
        """PJSIP's own log (SIP messages with SDP included)."""
        return self.workdir / "pjsip.log"

    @property
    def log_path(self) -> Path | None:
        return None if self.process is None else self.process.log_path

    def _on_line(self, line: str) -> None:
        if not line.startswith(PREFIX):
            return
        try:
            data = json.loads(line[len(PREFIX) :])
        except json.JSONDecodeError:
            data = {"event": "error", "message": f"unreadable report line: {line!r}"}
        name = str(data.pop("event"))
        self.events.append(PjsuaEvent(name=name, t=float(data.pop("t", 0.0)), fields=data))
        self._changed.set()

    async def start(self, *, within: float = 10.0) -> PjsuaPhone:
        self.process = await self._procs.start(
            self.name, self._argv, lifetime=self.max_seconds + 10, on_line=self._on_line
        )
        await self.wait_event("ready", within=within)
        return self

    async def __aenter__(self) -> PjsuaPhone:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.process is not None:
            await self.process.terminate()

    async def wait_event(
        self,
        name: str,
        *,
        within: float,
        nth: int = 1,
        where: Callable[[PjsuaEvent], bool] | None = None,
    ) -> PjsuaEvent:
        """The `nth` event called `name` (optionally also matching `where`), already seen ones included."""
        deadline = time.monotonic() + within
        while True:
            self._changed.clear()
            found = [e for e in self.events if e.name == name and (where is None or where(e))]
            if len(found) >= nth:
                return found[nth - 1]
            errors = [e for e in self.events if e.name == "error"]
            if errors:
                raise RuntimeError(f"{self.name} failed: {errors[0].get('message')}; log: {self.log_path}")
            if self.process is not None and not self.process.running:
                raise RuntimeError(f"{self.name} exited before {name}; log: {self.log_path}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [e.name for e in self.events]
                raise TimeoutError(f"{self.name}: no {name} #{nth} in {within}s (saw {seen}); log: {self.log_path}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=remaining)

    async def wait_state(self, state: str, *, within: float) -> PjsuaEvent:
        """Wait for a call state such as CONFIRMED or DISCONNECTED."""
        return await self.wait_event("call_state", within=within, where=lambda e: e.get("state") == state)

    async def wait_done(self, *, within: float) -> int:
        """Wait until the helper destroyed the library (recording final) and exited; its exit code."""
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        await self.wait_event("done", within=within)
        return await self.process.wait(within=within)

    def received_dtmf(self) -> str:
        return "".join(str(e.get("digit")) for e in self.events if e.name == "dtmf_received")

    def negotiated_codec(self) -> str | None:
        media = [e for e in self.events if e.name == "media_active"]
        return str(media[-1].get("codec")) if media else None
