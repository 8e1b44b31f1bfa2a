"""The local call-time application ``gateway bench call-hook`` asks: verifies each request's Standard Webhooks
signature (the `standardwebhooks` package, as a real receiver would) and accepts with instructions naming the
caller. Run as ``uvicorn bench._call_hook_app:app``; the secret comes from ``BENCH_HOOK_SECRET``."""

from __future__ import annotations

import json
import os

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

_WEBHOOK = Webhook(os.environ.get("BENCH_HOOK_SECRET", "bench-secret").encode())


async def call(request: Request) -> JSONResponse:
    body = await request.body()
    try:
        _WEBHOOK.verify(body, dict(request.headers))
    except WebhookVerificationError:
        return JSONResponse({"error": "bad signature"}, status_code=401)
    caller = json.loads(body)["context"]["caller_number"]
    return JSONResponse({"action": "accept", "instructions": f"Greet {caller} ({{caller_number}})."})


app = Starlette(routes=[Route("/call", call, methods=["POST"])])
