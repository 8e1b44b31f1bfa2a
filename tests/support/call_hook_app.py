"""A call-time application for tests: a tiny Starlette app that verifies each request's Standard Webhooks
signature with the `standardwebhooks` package, keeps what it was sent, and answers with a test's coroutine.

Serve it with :func:`tests.gateway.fleet.servers.serve` (uvicorn on 127.0.0.1, a free port)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# (status, JSON body or raw bytes) for one request's body
Decide = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


@dataclass
class CallHookApp:
    decide: Decide
    secret: str | None = None  # None: requests are not verified
    requests: list[dict[str, Any]] = field(default_factory=list)
    unsigned: int = 0  # requests whose signature did not verify (answered 401)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/call", self._call, methods=["POST"])])

    async def _call(self, request: Request) -> Response:
        body = await request.body()
        if self.secret is not None:
            try:
                Webhook(self.secret.encode()).verify(body, dict(request.headers))
            except WebhookVerificationError:
                self.unsigned += 1
                return JSONResponse({"error": "bad signature"}, status_code=401)
        payload = json.loads(body)
        self.requests.append(payload)
        self._arrived.set()
        status, answer = await self.decide(payload)
        if isinstance(answer, bytes):
            return Response(answer, status_code=status, media_type="application/json")
        return JSONResponse(answer, status_code=status)

    async def wait_requests(self, count: int, *, within: float) -> list[dict[str, Any]]:
        async with asyncio.timeout(within):
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.requests
