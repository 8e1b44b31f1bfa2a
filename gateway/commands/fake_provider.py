"""``gateway fake-provider``: run the local OpenAI-Realtime-compatible fake server (tests, load, demos).

Prints ``listening <websocket URL>`` on stdout once ready, serves until SIGINT/SIGTERM, then exits 0.
Every behaviour flag can also be set per connection as a query parameter of the websocket URL
(see :mod:`gateway.providers.fake_server`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="listen port; 0 picks a free one (default 8765)")
    parser.add_argument("--mode", choices=["echo", "tone", "speech-like"], default="echo", help="reply audio")
    parser.add_argument("--reply-ms", type=int, default=1000, help="length of tone / speech-like replies")
    parser.add_argument("--paced", action="store_true", help="send reply audio in real time, not all at once")
    parser.add_argument("--pace", type=float, default=1.0, help="speed of paced replies (2 = twice real time)")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per response.output_audio.delta")
    parser.add_argument("--vad-threshold-dbfs", type=float, default=-45.0, help="energy VAD threshold")
    parser.add_argument("--tool-name", default="", help="answer the first turn with a call of this function")
    parser.add_argument("--tool-arguments", default="{}", help="JSON arguments of the scripted tool call")
    parser.add_argument("--tool-turn", type=int, default=1, help="the caller turn answered with the tool call")
    parser.add_argument(
        "--reply-transcript",
        default="",
        help="the first reply's transcript, streamed as transcript deltas spread over its audio deltas",
    )
    parser.add_argument("--reply-delay-s", type=float, default=0.0, help="delay before each response starts")
    parser.add_argument("--session-delay-s", type=float, default=0.0, help="delay before session.created")
    parser.add_argument("--drop-after-s", type=float, default=0.0, help="abort each connection after N s")
    parser.add_argument("--drop-after-frames", type=int, default=0, help="abort after N caller frames (20 ms)")
    parser.add_argument("--expire-after-s", type=float, default=0.0, help="session_expired + close 1001 after N s")
    parser.add_argument("--error-after-frames", type=int, default=0, help="send one error event after N frames")
    parser.add_argument("--error-code", default="server_error", help="code of the injected error")
    parser.add_argument("--error-message", default="injected error", help="message of the injected error")
    parser.add_argument(
        "--fault-connections",
        type=int,
        default=0,
        help="apply the drop/expire/error faults to the first N connections only (0 = all)",
    )
    parser.add_argument(
        "--record",
        choices=["all", "meta", "none"],
        default="all",
        help="what to keep per connection: all events and audio, types and sizes only (load), nothing",
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="listen with SO_REUSEPORT: several fake processes on one --port share its connections (load tests)",
    )
    parser.add_argument("--no-uvloop", action="store_true", help="use the stdlib asyncio loop")


def main(args: argparse.Namespace) -> int:
    from gateway.commands._serve import run_loop
    from gateway.providers.fake_server import FakeOptions, run_fake_server

    try:
        options = FakeOptions(
            mode=args.mode,
            reply_ms=args.reply_ms,
            paced=args.paced,
            pace=args.pace,
            chunk_ms=args.chunk_ms,
            vad_threshold_dbfs=args.vad_threshold_dbfs,
            tool_name=args.tool_name,
            tool_arguments=args.tool_arguments,
            tool_turn=args.tool_turn,
            reply_delay_s=args.reply_delay_s,
            reply_transcript=args.reply_transcript,
            session_delay_s=args.session_delay_s,
            drop_after_s=args.drop_after_s,
            drop_after_frames=args.drop_after_frames,
            expire_after_s=args.expire_after_s,
            error_after_frames=args.error_after_frames,
            error_code=args.error_code,
            error_message=args.error_message,
            fault_connections=args.fault_connections,
            record=args.record,
        )
    except ValueError as exc:
        print(f"gateway fake-provider: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"listening {url}", flush=True)

    async def serve() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        # SIGINT/SIGTERM cancel this top-level task: that cancellation is the normal way out.
        with contextlib.suppress(asyncio.CancelledError):
            await run_fake_server(options, host=args.host, port=args.port, ready=ready, reuse_port=args.reuse_port)
        return 0

    try:
        # uvloop, as the worker and the load generator: under load the fake should cost less than what it loads.
        return run_loop(serve, use_uvloop=not args.no_uvloop)
    except OSError as exc:
        print(f"gateway fake-provider: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
