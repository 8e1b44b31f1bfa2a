"""``gateway run``: the all-in-one gateway — control plane + one media worker in one process.

SIP on 127.0.0.1:5060 (UDP+TCP), HTTP (ops API, dashboard, browser phone) on 127.0.0.1:8080, and the echo
agent unless GATEWAY_PROVIDER or the routes file says otherwise: no keys, no network needed. The worker
registers with the control plane through the same interface a remote worker uses over HTTP.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gateway.commands import worker_args

log = logging.getLogger("gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-host", help="HTTP bind address (default: GATEWAY_HTTP_HOST or 127.0.0.1)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default: GATEWAY_HTTP_PORT or 8080)")
    parser.add_argument("--config", help="routes/profiles TOML (default: GATEWAY_CONFIG or built-in echo route)")
    worker_args.add_worker_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.commands._serve import run_loop, serve
    from gateway.control.app import create_app
    from gateway.control.config import ConfigError
    from gateway.control.plane import ControlPlane
    from gateway.control.settings import ControlSettings, InsecureBindError, check_bind
    from gateway.fleet.links import InProcessControlLink
    from gateway.worker.worker import MediaWorker

    worker_args.setup_logging(args.log_level, service="gateway")
    overrides = {
        key: value
        for key, value in (("http_host", args.http_host), ("http_port", args.http_port), ("config", args.config))
        if value is not None
    }
    try:
        control_settings = ControlSettings(**overrides)
        mode = check_bind(control_settings)
        worker_settings = worker_args.worker_settings(args)
        model_factory = worker_args.model_factory(args.provider)
        amd_recognisers = worker_args.amd_recognisers()
        worker_args.preload_local_models()
    except (ConfigError, InsecureBindError) as exc:
        print(f"gateway run: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"gateway run: bad setting: {exc}", file=sys.stderr)
        return 2

    from gateway.transport.tls import TlsConfigError

    try:
        worker = MediaWorker(
            worker_settings, model_factory=model_factory, url="in-process", amd_recognisers=amd_recognisers
        )
    except (TlsConfigError, OSError) as exc:
        print(f"gateway run: SIP over TLS: {exc}", file=sys.stderr)
        return 2

    async def start_worker(plane: ControlPlane) -> None:
        worker.link = InProcessControlLink(plane, worker)
        await worker.start()

    try:
        from gateway.control.webrtc_api import webrtc_router

        app = create_app(control_settings, routers=[webrtc_router(worker.webrtc)], startup=[start_worker])
    except ConfigError as exc:
        print(f"gateway run: {exc}", file=sys.stderr)
        return 2

    async def stop(reason: str) -> None:
        if reason == "SIGTERM":  # an orchestrator's stop: drain first (gateway/worker/drain.py)
            await worker.drain(exit_when_empty=True, deadline_s=worker_settings.drain.drain_deadline_s)
            await worker.exited.wait()
        await worker.aclose("shutdown")
        app.state.plane.shutting_down.set()

    async def amain() -> int:
        log.info("%s", mode)
        log.info(
            "gateway: SIP sip:agent@%s:%d, HTTP http://%s:%d (dashboard /dashboard, phone /phone)",
            worker_settings.sip.public_host,
            worker_settings.sip.public_sip_port,
            control_settings.http_host,
            control_settings.http_port,
        )
        if "tls" in worker_settings.sip.sip_transports:
            log.info(
                "gateway: SIP over TLS sips:agent@%s:%d (fingerprint %s)",
                worker_settings.sip.public_host,
                worker.sip.tls_port,
                worker.sip_tls.fingerprint if worker.sip_tls is not None else "-",
            )
        started = await serve(
            app,
            host=control_settings.http_host,
            port=control_settings.http_port,
            log_level=args.log_level,
            on_stop=stop,
            stop_when=worker.exited,
            stop_timeout_s=lambda reason: worker_args.stop_timeout_s(worker_settings, worker.session_config, reason),
        )
        await worker.aclose("shutdown")
        return 0 if started else 1

    return run_loop(amain, use_uvloop=not args.no_uvloop)
