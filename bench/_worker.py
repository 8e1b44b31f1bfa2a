"""The media worker process that ``gateway bench calls`` measures: ``python -m bench._worker``.

It is the production :class:`~gateway.worker.worker.MediaWorker` (SIP, RTP sockets, the shared tick, one
CallSession per call, the provider websocket) without the control plane: admission is the worker's own
(``link=None``), so the figure is the worker's cost, not FastAPI's. Every call goes to the provider named by
``--provider`` (``openai`` at ``--openai-url``, the fake server: the full websocket + JSON + base64 path; or
``echo``), in the profile's ``--provider-format`` (``pcmu``: G.711 passthrough). Two knobs exist only for the
benchmark: ``--engine percall`` swaps the batched tick engine for the
per-call design of :mod:`bench._percall`, and ``--chunk-ms`` / ``--quiet-chunk-ms`` set
``SessionConfig.inbound_chunk_ms`` / ``inbound_quiet_chunk_ms``.
``--gc-census FILE`` appends a census of what the collector's middle passes walk to FILE
(:mod:`bench.census`). ``/metrics`` is served on ``--metrics-port`` by uvicorn on the worker's own loop
and rendered as ``gateway worker`` renders it (:func:`gateway.observability.exposition`), so the benchmark's
own scrapes weigh on the tick as a production scrape does (``--metrics-render generate_latest``: in one stretch,
for comparison).
SIGINT/SIGTERM end the calls and exit 0, so a profiler wrapping the process (``python -m cProfile -o FILE -m
bench._worker``) writes its output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator

from gateway.providers.base import RealtimeModel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._worker")
    parser.add_argument("--sip-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--rtp-ports", default="20000-29999")
    parser.add_argument("--provider", choices=["openai", "echo"], default="openai")
    parser.add_argument("--openai-url", default="")
    parser.add_argument("--engine", choices=["batched", "percall"], default="batched")
    parser.add_argument("--chunk-ms", type=int, default=20)
    parser.add_argument("--quiet-chunk-ms", type=int, default=100)
    parser.add_argument("--provider-format", choices=["pcm24k", "pcmu"], default="pcm24k")
    parser.add_argument("--capacity", type=int, default=5000)
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--gc-census", metavar="FILE", default="")
    parser.add_argument("--metrics-render", choices=["exposition", "generate_latest"], default="exposition")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from gateway.compiled import status as compiled_status
    from gateway.fleet.models import ProfileModel
    from gateway.observability import REGISTRY, exposition
    from gateway.providers.registry import ProviderSettings, create_model
    from gateway.session.config import SessionConfig
    from gateway.worker.settings import WorkerSettings
    from gateway.worker.worker import MediaWorker

    settings = WorkerSettings(
        worker_id="bench",
        sip_port=args.sip_port,
        rtp_ports=args.rtp_ports,
        capacity=args.capacity,
        sip_transports=("udp",),
        sip_rate_limit_per_s=100000.0,
        rtp_timeout_s=30.0,
    )
    provider_settings = ProviderSettings(
        provider=args.provider, openai_url=args.openai_url or ProviderSettings().openai_url
    )
    model = create_model(args.provider, provider_settings)

    def factory(name: str) -> RealtimeModel:
        return model  # every route's calls go to the provider under test

    worker = MediaWorker(
        settings,
        model_factory=factory,
        session_config=SessionConfig(inbound_chunk_ms=args.chunk_ms, inbound_quiet_chunk_ms=args.quiet_chunk_ms),
        default_profile=ProfileModel(name="bench", provider=args.provider, audio_format=args.provider_format),
    )
    if args.engine == "percall":
        from bench._percall import install

        install(worker)

    async def metrics(request: Request) -> Response:
        if args.metrics_render == "generate_latest":  # the comparison: the whole registry in one stretch
            return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
        return Response(await exposition(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    class MetricsServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the worker's own handlers (below) end the calls first, then stop this server

    # Bound and listening before "ready" is printed: the benchmark's first scrape may come at once.
    listener = socket.create_server(("127.0.0.1", args.metrics_port))
    config = uvicorn.Config(
        Starlette(routes=[Route("/metrics", metrics)]), lifespan="off", log_level="warning", access_log=False
    )
    metrics_server = MetricsServer(config)
    if args.gc_census:
        from pathlib import Path

        from bench.census import YoungCensus

        YoungCensus(Path(args.gc_census)).install()

    async def amain() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await worker.start()
        serving = asyncio.create_task(metrics_server.serve(sockets=[listener]), name="bench-metrics")
        print(
            f"bench worker ready: sip {args.sip_port} metrics {args.metrics_port} engine {args.engine} "
            f"{compiled_status()}",
            flush=True,
        )
        await stop.wait()
        await worker.aclose("shutdown")
        metrics_server.should_exit = True
        await serving
        return 0

    if not args.no_uvloop:
        import uvloop

        return int(uvloop.run(amain()))
    return asyncio.run(amain())


if __name__ == "__main__":
    sys.exit(main())
