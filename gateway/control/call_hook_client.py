"""The I/O half of the call-time application hook: one owned ``httpx.AsyncClient`` with bounded connections, the
signed POST, the deadline. What the answer means is :mod:`gateway.control.call_hook`'s.

Every way the application can fail — refused connection, timeout, an error status, bad JSON, a schema error, an
override naming an unknown template — ends in the route's fallback with the problem named (``HookOutcome.problem``),
never in an exception: a caller is ringing meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx

from gateway.control.call_hook import MAX_ANSWER_BYTES, CallHookRequest, HookOutcome, deadline_of, decide, fallback
from gateway.control.config import GatewayConfig, RouteConfig
from gateway.control.signing import WebhookSigner
from gateway.observability import CALL_HOOK_SECONDS

if TYPE_CHECKING:
    from gateway.control.plane import ControlPlane
    from gateway.control.settings import ControlSettings

log = logging.getLogger(__name__)

# Concurrent requests to applications; a burst of calls beyond it waits for a connection within its own deadline.
MAX_CONNECTIONS = 64


class CallHookClient:
    """Asks route applications about new calls. One per control plane; :meth:`aclose` when it stops."""

    def __init__(
        self,
        *,
        signer: WebhookSigner | None,
        default_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._signer = signer
        self.default_timeout_s = default_timeout_s
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        self._warned_unsigned = False

    async def ask(self, request: CallHookRequest, *, route: RouteConfig, config: GatewayConfig) -> HookOutcome:
        """The route's application's decision on ``request``, or the route's fallback naming what went wrong."""
        application = route.application
        assert application is not None
        deadline_s = deadline_of(application, self.default_timeout_s)
        body = request.model_dump_json().encode()
        headers = {"Content-Type": "application/json", "User-Agent": "voice-gateway call-hook"}
        if self._signer is not None:
            headers.update(self._signer.headers(body))
        elif not self._warned_unsigned:
            self._warned_unsigned = True
            log.warning("GATEWAY_WEBHOOK_SECRET is unset: call-time application requests go unsigned")
        started = time.monotonic()
        outcome = await self._post(application.url, body, headers, deadline_s, route=route, config=config)
        elapsed = time.monotonic() - started
        CALL_HOOK_SECONDS.labels("fallback" if outcome.fell_back else outcome.action).observe(elapsed)
        log.debug(
            "call %s: application %s: %s in %.1f ms%s",
            request.call_id,
            application.url,
            outcome.action,
            1000.0 * elapsed,
            f" (fallback: {outcome.problem})" if outcome.fell_back else "",
        )
        return outcome

    async def _post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        deadline_s: float,
        *,
        route: RouteConfig,
        config: GatewayConfig,
    ) -> HookOutcome:
        try:
            async with asyncio.timeout(deadline_s):
                async with self._client.stream(
                    "POST", url, content=body, headers=headers, timeout=deadline_s
                ) as response:
                    answer = await _read_bounded(response)
        except TimeoutError:
            return fallback(route, config, f"no answer within {deadline_s:g} s")
        except httpx.TimeoutException:
            return fallback(route, config, f"no answer within {deadline_s:g} s")
        except httpx.HTTPError as exc:
            return fallback(route, config, f"{type(exc).__name__}: {exc or 'request failed'}")
        return decide(response.status_code, answer, route=route, config=config)

    async def aclose(self) -> None:
        await self._client.aclose()


async def _read_bounded(response: httpx.Response) -> bytes:
    """The body, or one byte past the limit (which the parser then refuses) without reading the rest."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            break
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def attached(plane: ControlPlane, settings: ControlSettings) -> AsyncIterator[None]:
    """The plane's call-hook client for the app's life (cheap: it connects only when an application is asked)."""
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret is not None else ""
    client = CallHookClient(
        signer=WebhookSigner(secret) if secret else None, default_timeout_s=settings.call_hook_timeout_s
    )
    plane.call_hook = client
    try:
        yield
    finally:
        plane.call_hook = None
        await client.aclose()
