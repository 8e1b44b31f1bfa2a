"""baresip 1.0 as a scripted SIP phone for end-to-end tests.

Each `BaresipPhone` has its own config dir (`-f DIR`): a UDP SIP listener on 127.0.0.1 (or `host`, another
loopback address: a second trunk's source), an RTP port range
of its own, `aufile` as the audio source (the WAV it "speaks"), `alsa,null` as the player (baresip 1.0's
aufile has no player), and the `sndfile` audio filter, which writes what the phone sent and heard as
`dump-<time>-enc.wav` / `dump-<time>-dec.wav` in its recordings dir (complete once the call closed).

It is driven over `ctrl_tcp` (netstring-framed JSON): commands `{"command","params","token"}` answer
`{"response":true,"ok":...,"data":...,"token":...}`, and the phone pushes events
`{"event":true,"type":"CALL_ESTABLISHED"|"CALL_CLOSED"|"CALL_DTMF_START"|...,"param":...}`.
DTMF is sent with `sndcode` as RFC 4733 telephone-events; received DTMF arrives as CALL_DTMF_START with
the digit in `param`.

Two baresip 1.0 behaviours matter to tests: a call is hung up when the source WAV ends (pad the WAV with
`tail_silence` to keep a callee on the line), and aufile does not resample (8 kHz mono WAV for G.711,
48 kHz stereo for Opus).

SIP over TLS (baresip 1.0 on libre 1.1, as checked on this machine): TLS listens on the SIP port + 1 (`tls_port`),
with `sip_certificate` (one PEM file holding the certificate and its key; without it the listener cannot complete
a handshake) and `sip_cafile`. Dial over TLS with `;transport=tls` in the URI; the phone's Via and Contact then
name its TLS port. baresip 1.0 does not handle `sips:` URIs: its dial command takes `sips:...` for the user part
of a sip: URI, and in a dialog whose remote Contact is `sips:` it sends no BYE when it hangs up (pjsua2 does both).
baresip 1.0 has no `sip_verify_server` (that key came in later releases) and never verifies a server's
certificate, with or without `sip_cafile`: the checks of certificates are the gateway's side of the tests (its
verification of baresip as a callee) and pjsua2's, not baresip's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.audio import read_wav, with_silence, write_wav
from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

__all__ = ["BaresipCommandError", "BaresipEvent", "BaresipPhone", "BaresipRecording"]

MODULES = ("g711.so", "g722.so", "opus.so", "aufile.so", "alsa.so", "sndfile.so")
APP_MODULES = ("account.so", "menu.so", "ctrl_tcp.so")
# baresip 1.0's srtp.so media encryptions (account parameter mediaenc=): best effort on RTP/AVP, RTP/SAVP, RTP/SAVPF.
MEDIAENC = ("srtp", "srtp-mand", "srtp-mandf")
# An account's audio_codecs entry without rate/channels means x/8000/1 to baresip 1.0.
CODEC_ALIASES = {"opus": "opus/48000/2", "g722": "g722/16000/1"}


class BaresipCommandError(RuntimeError):
    """baresip answered a ctrl_tcp command with ok=false (or did not answer in time)."""


@dataclass(frozen=True, kw_only=True)
class BaresipEvent:
    """One event pushed by ctrl_tcp."""

    type: str
    klass: str
    param: str | None
    call_id: str | None
    peer_uri: str | None
    direction: str | None
    at: float
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class BaresipRecording:
    """What one call sent (`encoded`) and heard (`decoded`), as written by sndfile."""

    encoded: Path
    decoded: Path


def _netstring(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode()
    return str(len(body)).encode() + b":" + body + b","


class BaresipPhone:
    """One baresip process: `async with BaresipPhone(procs, dir, source_wav=...) as phone: ...`."""

    def __init__(
        self,
        procs: ProcessGroup,
        workdir: Path,
        *,
        source_wav: Path,
        name: str = "baresip",
        user: str = "phone",
        codecs: Sequence[str] = ("pcmu", "pcma"),
        auto_answer: bool = False,
        tail_silence: float = 0.0,
        lifetime: float = 60.0,
        mediaenc: str | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_cafile: Path | None = None,
        sip_trace: bool = False,
        host: str = "127.0.0.1",
        auth: tuple[str, str] | None = None,
        aor: str | None = None,
        regint: int = 0,
    ) -> None:
        """``mediaenc``: the account's media encryption, with baresip's srtp.so loaded: ``srtp`` (RTP/AVP with
        a=crypto, SRTP if answered so), ``srtp-mand`` (RTP/SAVP) or ``srtp-mandf`` (RTP/SAVPF). It is the media's
        only option here, apart from the SIP transport's, so the two combine (SIP over TLS with SRTP media).

        ``tls_cert``/``tls_key``: the certificate its TLS listener serves (joined into the one file baresip reads);
        ``tls_cafile``: its `sip_cafile` (read, but servers are not verified by baresip 1.0: see the module).
        ``sip_trace``: baresip writes every SIP message it sends and receives to its log (``-s``).

        ``host``: the address it listens and sends from; ``auth``: the (user, password) answering a 401/407;
        ``aor``: the account's address (the registrar is its host) and ``regint``: register it every so many
        seconds (0: never)."""
        self.name = name
        self.user = user
        self.codecs = tuple(CODEC_ALIASES.get(c.lower(), c) for c in codecs)
        self.auto_answer = auto_answer
        self.lifetime = lifetime
        self._procs = procs
        self.config_dir = Path(workdir) / name
        self.recordings_dir = self.config_dir / "recordings"
        self._source_wav = Path(source_wav)
        self._tail_silence = tail_silence
        if mediaenc not in (None, *MEDIAENC):
            raise ValueError(f"mediaenc must be one of {MEDIAENC}, got {mediaenc!r}")
        self.mediaenc = mediaenc
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        self.tls_cert, self.tls_key, self.tls_cafile = tls_cert, tls_key, tls_cafile
        self.sip_trace = sip_trace
        self.host, self.auth, self.aor, self.regint = host, auth, aor, regint
        # SIP on P (UDP and TCP; baresip takes P+1 for TLS), ctrl_tcp on P+2, RTP in P+4..P+11 (even start).
        ports = free_ports(12)
        self.sip_port = ports[0]
        self.ctrl_port = ports[2]
        rtp_low = ports[4] if ports[4] % 2 == 0 else ports[5]
        self.rtp_ports = (rtp_low, rtp_low + 6)
        self.events: list[BaresipEvent] = []
        self.process: ManagedProcess | None = None
        self._event_added = asyncio.Event()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tokens = itertools.count(1)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    # -- set-up -----------------------------------------------------------------------------------------

    @property
    def sip_uri(self) -> str:
        return f"sip:{self.user}@{self.host}:{self.sip_port}"

    @property
    def tls_port(self) -> int:
        return self.sip_port + 1

    @property
    def tls_uri(self) -> str:
        """Its address over TLS (its listener serves ``tls_cert``)."""
        return f"sip:{self.user}@{self.host}:{self.tls_port};transport=tls"

    @property
    def log_path(self) -> Path | None:
        return None if self.process is None else self.process.log_path

    def _write_config(self) -> Path:
        self.recordings_dir.mkdir(parents=True, exist_ok=True)
        source = self._source_wav
        if self._tail_silence > 0:
            source = write_wav(
                self.config_dir / "source.wav",
                with_silence(read_wav(self._source_wav), tail=self._tail_silence).samples,
                read_wav(self._source_wav).rate,
            )
        tls_lines = []
        if self.tls_cert is not None and self.tls_key is not None:
            bundle = self.config_dir / "sip-tls.pem"
            bundle.write_bytes(self.tls_cert.read_bytes() + self.tls_key.read_bytes())
            bundle.chmod(0o600)
            tls_lines.append(f"sip_certificate {bundle}")
        if self.tls_cafile is not None:
            tls_lines.append(f"sip_cafile {self.tls_cafile}")
        lines = [
            "poll_method epoll",
            f"sip_listen {self.host}:{self.sip_port}",
            *tls_lines,
            f"audio_source aufile,{source}",
            "audio_player alsa,null",
            "audio_alert alsa,null",
            f"rtp_ports {self.rtp_ports[0]}-{self.rtp_ports[1]}",
            "module_path /usr/lib/baresip/modules",
            *(f"module {m}" for m in MODULES),
            *(["module srtp.so"] if self.mediaenc else []),
            f"snd_path {self.recordings_dir}",
            *(f"module_app {m}" for m in APP_MODULES),
            f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
        ]
        (self.config_dir / "config").write_text("\n".join(lines) + "\n")
        answermode = "auto" if self.auto_answer else "manual"
        account = f"<{self.aor or self.sip_uri}>;regint={self.regint};audio_codecs={','.join(self.codecs)}"
        account += f";answermode={answermode}"
        if self.auth is not None:
            account += f";auth_user={self.auth[0]};auth_pass={self.auth[1]}"
        if self.mediaenc:
            account += f";mediaenc={self.mediaenc}"
        (self.config_dir / "accounts").write_text(account + "\n")
        (self.config_dir / "contacts").write_text("")
        return self.config_dir

    async def start(self, *, within: float = 10.0) -> BaresipPhone:
        self._write_config()
        argv = ["baresip", "-f", str(self.config_dir), "-n", self.host, "-t", str(int(self.lifetime))]
        if self.sip_trace:
            argv.append("-s")
        self.process = await self._procs.start(self.name, argv, lifetime=self.lifetime + 5)
        await self.process.wait_for_port(self.ctrl_port, within=within)
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.ctrl_port)
        self._reader_task = asyncio.create_task(self._read_ctrl(reader), name=f"{self.name}-ctrl")
        return self

    async def __aenter__(self) -> BaresipPhone:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- ctrl_tcp ---------------------------------------------------------------------------------------

    async def _read_ctrl(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                length = await reader.readuntil(b":")
                body = await reader.readexactly(int(length[:-1]) + 1)
                message = json.loads(body[:-1])
                if message.get("response"):
                    future = self._pending.pop(str(message.get("token")), None)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif message.get("event"):
                    self.events.append(
                        BaresipEvent(
                            type=str(message.get("type")),
                            klass=str(message.get("class")),
                            param=message.get("param"),
                            call_id=message.get("id"),
                            peer_uri=message.get("peeruri"),
                            direction=message.get("direction"),
                            at=time.monotonic(),
                            raw=message,
                        )
                    )
                    self._event_added.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(BaresipCommandError(f"{self.name}: ctrl_tcp closed; log: {self.log_path}"))
            self._event_added.set()

    async def command(self, command: str, params: str | None = None, *, within: float = 5.0) -> str:
        """Run a baresip command over ctrl_tcp; its `data` text, or BaresipCommandError."""
        if self._writer is None:
            raise BaresipCommandError(f"{self.name} is not started")
        token = f"t{next(self._tokens)}"
        payload: dict[str, Any] = {"command": command, "token": token}
        if params is not None:
            payload["params"] = params
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        self._writer.write(_netstring(payload))
        await self._writer.drain()
        try:
            answer = await asyncio.wait_for(future, timeout=within)
        except TimeoutError:
            self._pending.pop(token, None)
            raise BaresipCommandError(
                f"{self.name}: no answer to {command!r} in {within}s; log: {self.log_path}"
            ) from None
        if not answer.get("ok"):
            raise BaresipCommandError(f"{self.name}: {command} {params or ''} failed: {answer.get('data')!r}")
        return str(answer.get("data") or "")

    async def dial(self, uri: str) -> None:
        await self.command("dial", uri)

    async def answer(self) -> None:
        await self.command("accept")

    async def send_dtmf(self, digits: str, *, gap: float = 0.25) -> None:
        """Send each digit as an RFC 4733 event; `gap` seconds apart so each one is a separate event."""
        for index, digit in enumerate(digits):
            if index:
                # The inter-digit pause is part of what is being sent, not a wait for a condition.
                await asyncio.sleep(gap)
            await self.command("sndcode", digit)

    async def hangup(self) -> None:
        await self.command("hangup")

    async def quit(self, *, within: float = 5.0) -> int | None:
        """Ask baresip to exit (finalizing its recordings) and wait for it; its exit code."""
        if self.process is None:
            return None
        if self.process.running:
            with contextlib.suppress(BaresipCommandError, ConnectionError):
                await self.command("quit", within=within)
            with contextlib.suppress(TimeoutError):
                return await self.process.wait(within=within)
        return await self.process.terminate()

    async def aclose(self) -> None:
        await self.quit()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task

    # -- events -----------------------------------------------------------------------------------------

    async def wait_event(self, event_type: str, *, within: float, nth: int = 1) -> BaresipEvent:
        """The `nth` event of `event_type` since start (already seen ones count), within `within` s."""
        deadline = time.monotonic() + within
        while True:
            self._event_added.clear()
            matching = [e for e in self.events if e.type == event_type]
            if len(matching) >= nth:
                return matching[nth - 1]
            if self._reader_task is not None and self._reader_task.done():
                raise BaresipCommandError(f"{self.name} closed ctrl_tcp before {event_type}; log: {self.log_path}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [e.type for e in self.events]
                raise TimeoutError(
                    f"{self.name}: no {event_type} #{nth} in {within}s (saw {seen}); log: {self.log_path}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event_added.wait(), timeout=remaining)

    async def wait_established(self, *, within: float = 10.0, nth: int = 1) -> BaresipEvent:
        return await self.wait_event("CALL_ESTABLISHED", within=within, nth=nth)

    async def wait_closed(self, *, within: float = 10.0, nth: int = 1) -> BaresipEvent:
        return await self.wait_event("CALL_CLOSED", within=within, nth=nth)

    def received_dtmf(self) -> str:
        """Digits received so far (one per RFC 4733 event start)."""
        return "".join(e.param or "" for e in self.events if e.type == "CALL_DTMF_START")

    async def wait_dtmf(self, digits: str, *, within: float) -> str:
        """Wait until at least `len(digits)` digits arrived; the received digits (compare them yourself)."""
        await self.wait_event("CALL_DTMF_START", within=within, nth=len(digits))
        return self.received_dtmf()

    # -- recordings -------------------------------------------------------------------------------------

    def recordings(self) -> list[BaresipRecording]:
        """One entry per call, oldest first; the WAV headers are final once the call is closed."""
        decoded = sorted(self.recordings_dir.glob("*-dec.wav"))
        return [
            BaresipRecording(encoded=d.with_name(d.name.removesuffix("-dec.wav") + "-enc.wav"), decoded=d)
            for d in decoded
        ]

    def last_recording(self) -> BaresipRecording:
        found = self.recordings()
        if not found:
            raise FileNotFoundError(f"{self.name} recorded no call in {self.recordings_dir}; log: {self.log_path}")
        return found[-1]
