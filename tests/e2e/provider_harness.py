"""Harness of the provider-resilience tests: ``gateway fake-provider`` and ``gateway run`` (openai provider
pointed at the fake) as real subprocesses, a loopback webhook server for tools, and readers of what each
side saw.

- :func:`start_fake_provider` runs ``gateway fake-provider --port 0`` and reads its records over HTTP
  (``/records``, ``/records/<id>``, ``/records/<id>/audio``); :meth:`FakeProvider.wait_for` polls them with a
  deadline (HTTP has no push; the fake's own ``wait_until`` is in-process only).
- :func:`start_gateway_on_fake` writes a routes/profiles TOML (one route, one openai profile, optional
  webhook tools) and starts ``gateway run`` with ``GATEWAY_PROVIDER=openai`` and the fake's URL.
- :class:`WebhookServer` answers tool POSTs on 127.0.0.1 with a test-supplied coroutine and notes when each
  request arrived and was answered.
- :func:`session_counters` / :func:`barge_in_lines` / :func:`resume_lines` read the session's log lines (its
  closing counters; its barge-in decisions: the items cut, with the audio sent to the caller and received from
  the provider; each resume with the caller frames held meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.audio import Wav, envelope, read_wav, silence, speech_wav, to_mono, write_wav
from tests.support.procs import ManagedProcess, ProcessGroup

# ---------------------------------------------------------------------------------------------- the fake


@dataclass
class FakeProvider:
    process: ManagedProcess
    url: str  # ws://127.0.0.1:PORT/v1/realtime

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://", 1).removesuffix("/v1/realtime")

    async def _get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.http, trust_env=False, timeout=10.0) as client:
            response = await client.get(path)
            response.raise_for_status()
            return response

    async def records(self) -> list[dict[str, Any]]:
        """Summaries of every connection, oldest first."""
        summaries: list[dict[str, Any]] = (await self._get("/records")).json()
        return summaries

    async def record(self, conn_id: int) -> dict[str, Any]:
        """Everything one connection saw: events, timeline, tool outputs, truncations, ..."""
        detail: dict[str, Any] = (await self._get(f"/records/{conn_id}")).json()
        return detail

    async def audio(self, conn_id: int) -> bytes:
        """The caller audio one connection received, in arrival order."""
        return (await self._get(f"/records/{conn_id}/audio")).content

    async def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], *, within: float, what: str
    ) -> list[dict[str, Any]]:
        """Poll the record summaries until ``predicate`` holds; TimeoutError naming ``what`` after ``within`` s."""
        deadline = time.monotonic() + within
        while True:
            summaries = await self.records()
            if predicate(summaries):
                return summaries
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake provider: no {what} within {within} s; records: {summaries}")
            # The records are only reachable over HTTP: polling is the only way to see them change.
            await asyncio.sleep(0.05)

    async def wait_for_record(
        self, conn_id: int, predicate: Callable[[dict[str, Any]], bool], *, within: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            detail = await self.record(conn_id)
            if predicate(detail):
                return detail
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake provider connection {conn_id}: no {what} within {within} s")
            await asyncio.sleep(0.05)


async def start_fake_provider(
    procs: ProcessGroup, *args: str, vad_threshold_dbfs: float = -60.0, lifetime: float = 120.0
) -> FakeProvider:
    """``gateway fake-provider`` on an ephemeral loopback port with ``args``.

    The fake's energy VAD threshold defaults to -60 dBFS here: espeak's softest syllables dip to about -46 dBFS,
    which the fake's own default (-45) would count as silence and so end a turn in the middle of a sentence.
    """
    argv = ["fake-provider", "--host", "127.0.0.1", "--port", "0", "--vad-threshold-dbfs", str(vad_threshold_dbfs)]
    process = await procs.start(
        "fake-provider",
        [sys.executable, "-m", "gateway", *argv, *args],
        env={"PYTHONUNBUFFERED": "1"},
        lifetime=lifetime,
    )
    match = await process.wait_for_output(r"listening (ws://127\.0\.0\.1:\d+/v1/realtime)", within=30)
    return FakeProvider(process=process, url=match.group(1))


# ------------------------------------------------------------------------------------------- the gateway


@dataclass(frozen=True, kw_only=True)
class WebhookToolSpec:
    name: str
    url: str
    timeout_s: float = 10.0
    description: str = "Look up an order."


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def write_config(
    path: Path,
    *,
    tools: tuple[WebhookToolSpec, ...] = (),
    audio_format: str = "pcm24k",
    profile_lines: tuple[str, ...] = (),
    extra_toml: str = "",
    route_lines: tuple[str, ...] = (),
) -> Path:
    """The routes file: every number to one ``openai`` profile ("agent"); ``profile_lines`` are more TOML lines of
    the profile, ``route_lines`` of the route, ``extra_toml`` is appended as written (e.g.
    ``[[profiles.agent.guardrails]]`` tables)."""
    lines = [
        "[[routes]]",
        'name = "all"',
        'did = "*"',
        'profile = "agent"',
        *route_lines,
        "",
        "[profiles.agent]",
        'provider = "openai"',
        'instructions = "You are a test agent."',
        f"audio_format = {_toml_string(audio_format)}",
        *profile_lines,
    ]
    for tool in tools:
        lines += [
            "",
            "[[profiles.agent.tools]]",
            f"name = {_toml_string(tool.name)}",
            f"description = {_toml_string(tool.description)}",
            f"url = {_toml_string(tool.url)}",
            f"timeout_s = {tool.timeout_s}",
        ]
    path.write_text("\n".join(lines) + "\n" + extra_toml)
    return path


async def start_gateway_on_fake(
    procs: ProcessGroup,
    tmp_path: Path,
    fake: FakeProvider,
    *,
    tools: tuple[WebhookToolSpec, ...] = (),
    audio_format: str = "pcm24k",
    env: dict[str, str] | None = None,
    profile_lines: tuple[str, ...] = (),
    extra_toml: str = "",
    route_lines: tuple[str, ...] = (),
) -> GatewayProcess:
    config = write_config(
        tmp_path / "gateway.toml",
        tools=tools,
        audio_format=audio_format,
        profile_lines=profile_lines,
        extra_toml=extra_toml,
        route_lines=route_lines,
    )
    return await start_gateway(
        procs,
        env={
            "GATEWAY_PROVIDER": "openai",
            "GATEWAY_OPENAI_URL": fake.url,
            "OPENAI_API_KEY": "",  # the fake needs none; never hand it one from the environment
            "GATEWAY_CONFIG": str(config),
            **(env or {}),
        },
    )


async def only_call(gateway: GatewayProcess) -> dict[str, Any]:
    calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    items = calls["items"] if isinstance(calls, dict) else calls
    assert len(items) == 1, f"expected one ended call, got {items}"
    call: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{items[0]['id']}")
    return call


_ENDED = re.compile(r"call (\S+) ended: ([^;\n]+); ([^\n]*)")
_BARGE_IN = re.compile(r"call (\S+): barge-in \((\w+)\) response=(\S*) cancelled=(\w+) items=([^\n]*)")


async def session_counters(gateway: GatewayProcess, *, within: float = 10.0) -> dict[str, int | str]:
    """The counters of the call's session from its closing log line (frames_in, frames_to_provider, ...)."""
    match = await gateway.process.wait_for_output(_ENDED, within=within)
    counters: dict[str, int | str] = {"call_id": match.group(1), "reason": match.group(2)}
    for pair in match.group(3).split():
        name, _, value = pair.partition("=")
        counters[name] = int(value)
    return counters


_RESUMED = re.compile(r"call (\S+): resumed after (\w+) \(attempt (\d+)\), (\d+) caller frames held")


def resume_lines(gateway: GatewayProcess) -> list[tuple[str, int, int]]:
    """(cause, attempt, caller frames held while reconnecting) of each resume, from the session's log."""
    return [(m.group(2), int(m.group(3)), int(m.group(4))) for m in _RESUMED.finditer(gateway.process.output)]


@dataclass(frozen=True, kw_only=True)
class BargeInLine:
    trigger: str
    response_id: str
    cancelled: bool
    items: dict[str, tuple[int, int]]  # item_id -> (sent_ms, received_ms)


def barge_in_lines(gateway: GatewayProcess) -> list[BargeInLine]:
    found = []
    for match in _BARGE_IN.finditer(gateway.process.output):
        items = {}
        for part in match.group(5).split():
            if part == "-":
                continue
            item_id, sent, received = part.split(":")
            items[item_id] = (int(sent.removeprefix("sent_ms=")), int(received.removeprefix("received_ms=")))
        found.append(
            BargeInLine(
                trigger=match.group(2),
                response_id=match.group(3),
                cancelled=match.group(4) == "True",
                items=items,
            )
        )
    return found


_TRIPPED = re.compile(
    r"call (\S+): guardrail (\S+) tripped response=(\S*) received_at=(\S+) stopped_at=(\S+) stopped_frame=(\S+) "
    r"items=([^\n]*)"
)


@dataclass(frozen=True, kw_only=True)
class TripLine:
    guardrail: str
    response_id: str
    received_at: float  # the session clock when the judged text reached the gateway
    stopped_at: float | None  # ... and at the first media tick that sent none of the cut audio
    stopped_frame: int | None
    items: dict[str, tuple[int, int]]  # item_id -> (sent_ms, received_ms)


def trip_lines(gateway: GatewayProcess) -> list[TripLine]:
    """The session's ``guardrail ... tripped`` log lines."""
    found = []
    for match in _TRIPPED.finditer(gateway.process.output):
        items = {}
        for part in match.group(7).split():
            if part != "-":
                item_id, sent, received = part.split(":")
                items[item_id] = (int(sent.removeprefix("sent_ms=")), int(received.removeprefix("received_ms=")))
        stopped_at, stopped_frame = match.group(5), match.group(6)
        found.append(
            TripLine(
                guardrail=match.group(2),
                response_id=match.group(3),
                received_at=float(match.group(4)),
                stopped_at=None if stopped_at == "None" else float(stopped_at),
                stopped_frame=None if stopped_frame == "None" else int(stopped_frame),
                items=items,
            )
        )
    return found


# --------------------------------------------------------------------------------------- webhook server


@dataclass
class WebhookRequest:
    received_at: float
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    answered_at: float | None = None
    status: int | None = None


Answer = Callable[[WebhookRequest], Awaitable[tuple[int, dict[str, Any]]]]


@dataclass
class WebhookServer:
    """A minimal HTTP/1.1 server on 127.0.0.1 for webhook tools: ``answer(request)`` -> (status, JSON body).

    An answer that is still pending when the client gives up (the tool's timeout) is cancelled with the
    connection; every answer is bounded by ``max_hold_s``.
    """

    answer: Answer
    max_hold_s: float = 20.0
    requests: list[WebhookRequest] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/tool"

    async def __aenter__(self) -> WebhookServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # Connections still being served (an answer held by a failed test) end with the server.
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def wait_requests(self, count: int, *, within: float) -> list[WebhookRequest]:
        async with asyncio.timeout(within):
            while len(self.requests) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.requests

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            async with asyncio.timeout(self.max_hold_s + 5):
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in header_lines:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = WebhookRequest(
                    received_at=time.time(),
                    path=request_line.split(" ")[1],
                    headers=headers,
                    body=json.loads(body) if body else {},
                )
                self.requests.append(request)
                self._changed.set()
                answer_task = asyncio.ensure_future(self.answer(request))
                # The client closing its side (tool timeout) ends the wait as well.
                gone_task = asyncio.ensure_future(reader.read(1))
                try:
                    done, _ = await asyncio.wait(
                        {answer_task, gone_task}, timeout=self.max_hold_s, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for task in (answer_task, gone_task):
                        task.cancel()
                    await asyncio.gather(answer_task, gone_task, return_exceptions=True)
                if answer_task not in done or answer_task.cancelled():
                    return
                status, payload = answer_task.result()
                data = json.dumps(payload).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                    f"Connection: close\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
                request.answered_at, request.status = time.time(), status
                self._changed.set()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self._handlers.discard(handler)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


# ------------------------------------------------------------------------------------------------ audio


def caller_wav(path: Path, parts: list[str | float], *, rate: int = 8000) -> Path:
    """A phone's source WAV: each ``str`` is spoken (espeak-ng), each ``float`` is that many seconds of silence."""
    pieces = []
    for index, part in enumerate(parts):
        if isinstance(part, str):
            spoken = read_wav(speech_wav(part, path.with_name(f"{path.stem}-{index}.wav"), rate=rate))
            pieces.append(spoken.samples)
        else:
            pieces.append(silence(part, rate))
    return write_wav(path, np.concatenate(pieces, axis=0), rate)


@dataclass(frozen=True, kw_only=True)
class Burst:
    start_s: float
    end_s: float
    frequency_hz: float

    @property
    def duration_ms(self) -> float:
        return (self.end_s - self.start_s) * 1000.0


def bursts(wav: Wav, *, level: float = 0.02, min_gap_s: float = 0.05, min_len_s: float = 0.05) -> list[Burst]:
    """Stretches of sound in a recording (the agent's replies): envelope above ``level`` (full scale 1.0), with
    gaps shorter than ``min_gap_s`` bridged, each with its dominant frequency."""
    mono = to_mono(wav.samples)
    env = envelope(mono, wav.rate, window=0.005)
    loud = env > level
    edges = np.flatnonzero(np.diff(np.concatenate(([0], loud.astype(np.int8), [0]))))
    spans = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    merged: list[tuple[int, int]] = []
    for start, stop in spans:
        if merged and start - merged[-1][1] < min_gap_s * wav.rate:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    found = []
    for start, stop in merged:
        if stop - start < min_len_s * wav.rate:
            continue
        piece = mono[start:stop]
        spectrum = np.abs(np.fft.rfft(piece * np.hanning(piece.size)))
        frequency = float(np.fft.rfftfreq(piece.size, 1 / wav.rate)[int(np.argmax(spectrum))])
        found.append(Burst(start_s=start / wav.rate, end_s=stop / wav.rate, frequency_hz=frequency))
    return found


@dataclass(frozen=True, kw_only=True)
class WindowMatch:
    start_s: float  # where the window starts in the reference
    correlation: float  # at the global lag
    slipped_correlation: float  # the best of the same window one 20 ms frame earlier or later


@dataclass(frozen=True)
class FollowedWindow:
    start_s: float  # where the window starts in the reference
    lag: int  # where it was found: received[n + lag] matches reference[n]
    correlation: float  # there


def _audible_windows(
    reference: npt.NDArray[np.float64], window_s: float, quiet: float, rate: int
) -> Iterator[tuple[int, npt.NDArray[np.float64]]]:
    """(start, samples) of each ``window_s`` window louder than ``quiet`` x the reference's RMS."""
    window = round(window_s * rate)
    floor = quiet * float(np.sqrt(np.mean(reference**2)))
    for start in range(0, reference.size - window + 1, window):
        piece = reference[start : start + window]
        if float(np.sqrt(np.mean(piece**2))) > floor:
            yield start, piece


def _pearson_at(received: npt.NDArray[np.float64], piece: npt.NDArray[np.float64], at: int) -> float:
    """``piece`` against ``received[at:]``; 0 where ``received`` does not hold it."""
    if at < 0 or at + piece.size > received.size:
        return 0.0
    other = received[at : at + piece.size]
    return float(np.corrcoef(piece, other)[0, 1]) if np.std(other) > 0 else 0.0


def followed_windows(
    reference: npt.NDArray[np.float64],
    received: npt.NDArray[np.float64],
    rate: int,
    *,
    lag: int,
    window_s: float = 0.4,
    quiet: float = 0.1,
    reach_frames: int = 3,
) -> list[FollowedWindow]:
    """Each audible window of ``reference`` found in ``received`` at whole 20 ms frames (up to ``reach_frames``)
    from where the window before it was found, the first at ``lag``: a jitter buffer that concealed or discarded
    a frame moves everything after it by a frame, and the windows follow. Where the lag changes, a frame was
    inserted or lost between the two windows (the one straddling it matches at neither lag as well)."""
    frame = rate // 50
    found: list[FollowedWindow] = []
    for start, piece in _audible_windows(reference, window_s, quiet, rate):
        scored = [
            (_pearson_at(received, piece, start + lag + k * frame), -abs(k), lag + k * frame)
            for k in range(-reach_frames, reach_frames + 1)
        ]
        correlation, _, at = max(scored)  # the best; the nearest of equals
        found.append(FollowedWindow(start_s=start / rate, lag=at, correlation=correlation))
        lag = at
    return found


def window_matches(
    reference: npt.NDArray[np.float64],
    received: npt.NDArray[np.float64],
    rate: int,
    *,
    lag: int,
    window_s: float = 0.4,
    quiet: float = 0.1,
) -> list[WindowMatch]:
    """Pearson correlation of each audible window of ``reference`` with ``received`` at one global ``lag``
    (``received[n + lag]`` matches ``reference[n]``).

    A lost or repeated frame anywhere shifts everything after it, so those windows stop correlating at the
    global lag; ``slipped_correlation`` shows how low a one-frame slip would score on this very audio (the
    measuring stick's resolution). A window missing from ``received`` scores 0; windows quieter than ``quiet``
    x the reference's RMS are skipped (silence has no position).
    """
    frame = rate // 50
    matches = []
    for start, piece in _audible_windows(reference, window_s, quiet, rate):
        at = start + lag
        slipped = max(_pearson_at(received, piece, at - frame), _pearson_at(received, piece, at + frame))
        correlation = _pearson_at(received, piece, at)
        matches.append(WindowMatch(start_s=start / rate, correlation=correlation, slipped_correlation=slipped))
    return matches
