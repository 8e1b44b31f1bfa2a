"""``gateway drain``: ask a media worker (through its own internal API) to drain, and optionally wait for it.

Made for a Kubernetes ``preStop`` hook (deploy/k8s/): it runs in the worker's container, so the defaults are
that container's: the worker API on http://127.0.0.1:8081, the bearer token in GATEWAY_API_TOKEN, the deadline
in GATEWAY_DRAIN_DEADLINE_S. The worker stops taking calls at once (OPTIONS and INVITE get 503, so the SIP
balancer moves new calls elsewhere); the calls still up at the deadline are ended politely
(gateway/worker/drain.py). With ``--wait`` the command returns once the worker carries no call (or has exited);
the SIGTERM that follows then finds nothing left to wait for.

Exit status: 0 drained (and, with --wait, empty), 1 the worker refused or could not be reached, 2 bad arguments,
3 --wait gave up (``--timeout``) with calls still up.
"""

from __future__ import annotations

import argparse
import sys
import time

DEFAULT_API = "http://127.0.0.1:8081"
POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", default=DEFAULT_API, help=f"the worker's internal API (default {DEFAULT_API})")
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds the live calls may still run before they are ended politely (default GATEWAY_DRAIN_DEADLINE_S)",
    )
    parser.add_argument("--no-deadline", action="store_true", help="let the live calls run to their own end")
    parser.add_argument("--exit", action="store_true", help="the worker process exits once its last call ends")
    parser.add_argument("--wait", action="store_true", help="return only when the worker carries no call")
    parser.add_argument(
        "--timeout", type=float, help="with --wait: give up after this long (default: the deadline plus 60 s)"
    )


def main(args: argparse.Namespace) -> int:
    import httpx
    from pydantic import ValidationError

    from gateway.control.settings import ControlSettings
    from gateway.fleet.http import INTERNAL_PREFIX
    from gateway.fleet.models import DrainRequest
    from gateway.worker.settings import DrainSettings

    try:
        token = ControlSettings().token
        deadline_s = None if args.no_deadline else args.deadline
        if deadline_s is None and not args.no_deadline:
            deadline_s = DrainSettings().drain_deadline_s
        body = DrainRequest(exit_when_empty=args.exit, deadline_s=deadline_s)
    except ValidationError as exc:
        print(f"gateway drain: bad setting: {exc}", file=sys.stderr)
        return 2
    timeout = args.timeout if args.timeout is not None else (deadline_s or 0.0) + 60.0
    if args.wait and args.no_deadline and args.timeout is None:
        timeout = float("inf")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = args.api.rstrip("/") + INTERNAL_PREFIX
    with httpx.Client(base_url=base, headers=headers, timeout=10.0) as client:
        try:
            response = client.post("/drain", json=body.model_dump())
        except httpx.HTTPError as exc:
            print(f"gateway drain: cannot reach the worker at {args.api}: {exc}", file=sys.stderr)
            return 1
        if response.status_code != 204:
            print(f"gateway drain: the worker answered {response.status_code}: {response.text}", file=sys.stderr)
            return 1
        until = "their end" if deadline_s is None else f"{deadline_s:g} s"
        print(f"gateway drain: draining; live calls may run for {until}", flush=True)
        if not args.wait:
            return 0
        return _wait_empty(client, timeout)


def _wait_empty(client: object, timeout: float) -> int:
    import httpx

    assert isinstance(client, httpx.Client)
    give_up = time.monotonic() + timeout
    last: int | None = None
    while True:
        try:
            response = client.get("/calls")
        except httpx.TransportError:
            print("gateway drain: the worker has stopped", flush=True)
            return 0
        if response.status_code != 200:
            print(f"gateway drain: the worker answered {response.status_code}: {response.text}", file=sys.stderr)
            return 1
        live = len(response.json())
        if live == 0:
            print("gateway drain: no call left", flush=True)
            return 0
        if live != last:
            print(f"gateway drain: {live} call(s) still up", flush=True)
            last = live
        if time.monotonic() >= give_up:
            print(f"gateway drain: gave up waiting with {live} call(s) still up", file=sys.stderr)
            return 3
        time.sleep(POLL_S)
