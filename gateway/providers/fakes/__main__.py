"""Run one vendor fake on 127.0.0.1 until interrupted: ``python -m gateway.providers.fakes VENDOR [options]``.

For manual runs, load tests and end-to-end tests in another process: it prints one line, ``listening <url>``, once
the socket is bound (``--port 0`` picks a free port), where ``<url>`` is what ``GATEWAY_PIPELINE_URLS`` takes for
that vendor, then serves until SIGINT or SIGTERM. Messages are counted, not kept, unless ``--keep-messages``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from gateway.providers.fakes.fake_cartesia import CartesiaOptions, FakeCartesiaServer
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.fakes.fake_openai_speech import FakeOpenAISpeechServer, SpeechOptions
from gateway.providers.fakes.fake_openai_transcribe import FakeOpenAITranscribeServer, TranscribeOptions

VENDORS = ("deepgram", "elevenlabs", "cartesia", "openai-speech", "openai-transcribe")


def _server(args: argparse.Namespace) -> Any:
    """The fake for ``args.vendor`` (each has ``base_url``)."""
    common: dict[str, Any] = {"api_key": args.api_key, "port": args.port}
    keep = {"keep_messages": args.keep_messages}
    transcripts = tuple(t for t in args.transcript.split("|") if t) or ("hello world",)
    if args.vendor == "deepgram":
        return FakeDeepgramServer(DeepgramOptions(transcripts=transcripts), **common, **keep)
    if args.vendor == "elevenlabs":
        return FakeElevenLabsServer(ElevenLabsOptions(pace=args.pace), **common, **keep)
    if args.vendor == "cartesia":
        return FakeCartesiaServer(CartesiaOptions(pace=args.pace), **common, **keep)
    if args.vendor == "openai-speech":
        return FakeOpenAISpeechServer(SpeechOptions(pace=args.pace), **common)
    return FakeOpenAITranscribeServer(TranscribeOptions(transcripts=transcripts), **common, **keep)


async def serve(args: argparse.Namespace) -> None:
    fake = _server(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with fake:
        print(f"listening {fake.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.providers.fakes", description=__doc__.splitlines()[0])
    parser.add_argument("vendor", choices=VENDORS)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default=None, help="refuse other keys with 401 (default: accept any)")
    parser.add_argument("--pace", type=float, default=1.0, help="TTS audio speed against real time (0: at once)")
    parser.add_argument("--transcript", default="", help="STT transcripts, one per utterance, '|' between them")
    parser.add_argument("--keep-messages", action="store_true", help="keep every message (tests), not counts")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
