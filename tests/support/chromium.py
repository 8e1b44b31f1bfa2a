"""Headless Debian Chromium driven by Playwright's Python API, as a WebRTC caller with a fake microphone.

Playwright is used only as a driver: the browser is the system's /usr/bin/chromium (never
`playwright install`), started with a fresh user-data dir per run and the flags that keep it on loopback
(shared/PEERS.md): fake media devices whose microphone plays a WAV file, a host resolver that maps every
name except 127.0.0.1 to NOTFOUND, no QUIC, no background networking, loopback allowed for
PeerConnections, and `WebRtcHideLocalIpsWithMdns` disabled so ICE offers 127.0.0.1 instead of an mDNS name.

Chromium honours only the last `--disable-features` flag, and Playwright passes its own list; so the list
Playwright passes is read from its driver bundle and merged with ours into one flag placed last. After
launch the browser's real command line is checked (via psutil) so a Playwright upgrade that changes this
fails loudly instead of silently leaking mDNS candidates.

The browser's PIDs are recorded at launch and any survivor is killed by PID after the context closes.
`LoopbackHttpServer` serves test pages from memory on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "CHROMIUM",
    "ChromiumSession",
    "LoopbackHttpServer",
    "chromium_args",
    "launch_chromium",
    "playwright_disabled_features",
]

CHROMIUM = "/usr/bin/chromium"
OUR_DISABLED_FEATURES = ("WebRtcHideLocalIpsWithMdns",)
LOOPBACK_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


@functools.cache
def playwright_disabled_features() -> tuple[str, ...]:
    """The features Playwright's driver disables for Chromium, read from its bundled JavaScript."""
    import playwright

    package = Path(playwright.__file__).parent / "driver" / "package" / "lib"
    for bundle in sorted(package.rglob("*.js")):
        text = bundle.read_text(errors="replace")
        match = re.search(r"disabledFeatures\s*=\s*(?:\([^)]*\)\s*=>\s*)?\[(.*?)\]", text, re.S)
        if match:
            body = re.sub(r"//[^\n]*", "", match.group(1))
            return tuple(re.findall(r"""["']([A-Za-z0-9_]+)["']""", body))
    return ()


def chromium_args(fake_audio_wav: Path | None) -> list[str]:
    """Our flags; the merged `--disable-features` comes last so Chromium keeps it."""
    args = list(LOOPBACK_FLAGS)
    if fake_audio_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={fake_audio_wav}")
    features = list(dict.fromkeys([*playwright_disabled_features(), *OUR_DISABLED_FEATURES]))
    args.append("--disable-features=" + ",".join(features))
    return args


def _effective_disabled_features(cmdline: list[str]) -> tuple[set[str], set[str]]:
    """(features in the last --disable-features flag, features in all of them)."""
    lists = [arg.split("=", 1)[1].split(",") for arg in cmdline if arg.startswith("--disable-features=")]
    if not lists:
        return set(), set()
    return set(lists[-1]), {feature for flags in lists for feature in flags}


@dataclass(kw_only=True)
class ChromiumSession:
    """A running browser: `context` is Playwright's BrowserContext; `command_line` is what Chromium got."""

    context: Any
    browser_pid: int
    pids: list[int]
    command_line: list[str]
    user_data_dir: Path
    console: list[str] = field(default_factory=list)

    async def new_page(self) -> Any:
        page = await self.context.new_page()
        page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))
        return page


def _browser_processes(user_data_dir: Path) -> tuple[psutil.Process | None, list[psutil.Process]]:
    marker = f"--user-data-dir={user_data_dir}"
    main: psutil.Process | None = None
    family: list[psutil.Process] = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.cmdline()
            if not cmdline or "chrom" not in Path(cmdline[0]).name:
                continue
            family.append(proc)
            if marker in cmdline and not any(arg.startswith("--type=") for arg in cmdline):
                main = proc
    return main, family


@contextlib.asynccontextmanager
async def launch_chromium(
    workdir: Path, *, fake_audio_wav: Path | None = None, headless: bool = True
) -> AsyncIterator[ChromiumSession]:
    """Start /usr/bin/chromium with a fresh profile under `workdir`; stop it (by PID if need be) on exit."""
    from playwright.async_api import async_playwright

    user_data_dir = Path(workdir) / "chromium-profile"
    user_data_dir.mkdir(parents=True, exist_ok=False)
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=CHROMIUM,
            headless=headless,
            args=chromium_args(fake_audio_wav),
            timeout=30_000,
        )
        main, family = _browser_processes(user_data_dir)
        try:
            if main is None:
                raise RuntimeError(f"launched Chromium but found no browser process for {user_data_dir}")
            cmdline = main.cmdline()
            kept, passed = _effective_disabled_features(cmdline)
            missing = (passed | set(OUR_DISABLED_FEATURES)) - kept
            if missing:
                raise RuntimeError(f"Chromium keeps only the last --disable-features; it lacks {sorted(missing)}")
            yield ChromiumSession(
                context=context,
                browser_pid=main.pid,
                pids=[p.pid for p in family],
                command_line=cmdline,
                user_data_dir=user_data_dir,
            )
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(context.close(), timeout=10)
            _, family_now = _browser_processes(user_data_dir)
            survivors = {p.pid: p for p in [*family, *family_now]}
            for proc in survivors.values():
                with contextlib.suppress(psutil.Error):
                    proc.kill()


class LoopbackHttpServer:
    """Serves fixed pages (`{"/": b"<html>..."}`) over HTTP/1.0 on 127.0.0.1, for browser tests."""

    def __init__(self, pages: Mapping[str, bytes | str], *, content_type: str = "text/html; charset=utf-8") -> None:
        self.pages = {path: body.encode() if isinstance(body, str) else body for path, body in pages.items()}
        self.content_type = content_type
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            self.requests.append(request_line)
            parts = request_line.split(" ")
            path = parts[1].split("?", 1)[0] if len(parts) > 1 else "/"
            body = self.pages.get(path)
            if body is None:
                status, body, kind = "404 Not Found", b"not found", "text/plain"
            else:
                status, kind = "200 OK", self.content_type
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def __aenter__(self) -> LoopbackHttpServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
