"""A real HTTP receiver of event webhooks for tests: a Starlette app served by uvicorn on 127.0.0.1, in the test's
event loop. It verifies every request's Standard Webhooks signature with the `standardwebhooks` library, can fail
on purpose (``fail_next`` answers 503), and can be down (``stop()``: the port refuses connections until
``start()``). Tests wait on it with a deadline (``wait_for``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.procs import free_ports


@dataclass(frozen=True)
class Received:
    webhook_id: str
    type: str
    data: dict[str, Any]


class WebhookReceiver:
    """``await receiver.start()``; ``receiver.url``; ``await receiver.stop()`` (down) and ``start()`` again."""

    def __init__(self, secret: str, *, port: int | None = None) -> None:
        self.secret = secret
        self.port = port or free_ports(1)[0]
        self.received: list[Received] = []  # every verified request, duplicates included, in arrival order
        self.rejected: list[str] = []  # why requests failed verification
        self.fail_next = 0  # answer this many more requests with 503
        self.fail_call: str | None = None  # answer 503 to every event of this call
        self.failed = 0
        self._webhook = Webhook(secret)
        self._changed = asyncio.Condition()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        try:
            self._webhook.verify(body, dict(request.headers))
        except WebhookVerificationError as exc:
            self.rejected.append(str(exc))
            return Response(status_code=400)
        payload = orjson.loads(body)
        if self.fail_next > 0 or (self.fail_call is not None and payload["data"].get("call_id") == self.fail_call):
            self.fail_next = max(0, self.fail_next - 1)
            self.failed += 1
            return Response("failing on purpose", status_code=503)
        self.received.append(Received(request.headers["webhook-id"], payload["type"], payload["data"]))
        async with self._changed:
            self._changed.notify_all()
        return Response(status_code=204)

    async def start(self) -> None:
        app = Starlette(routes=[Route("/hooks", self._hook, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(), name="webhook-receiver")
        async with asyncio.timeout(10):
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._server = None
        self._task = None

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def unique(self) -> dict[str, Received]:
        """The events received, de-duplicated by ``webhook-id`` (first arrival kept), in arrival order."""
        seen: dict[str, Received] = {}
        for item in self.received:
            seen.setdefault(item.webhook_id, item)
        return seen

    def types_by_call(self) -> dict[str, list[str]]:
        """Each call's event types, de-duplicated, in the order they first arrived."""
        calls: dict[str, list[str]] = {}
        for item in self.unique().values():
            calls.setdefault(str(item.data.get("call_id")), []).append(item.type)
        return calls

    async def wait_for(self, predicate: Callable[[WebhookReceiver], bool], *, within: float) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: predicate(self))
