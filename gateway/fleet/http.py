"""The fleet contract over HTTP: HttpControlLink (worker -> plane) and HttpWorkerCommands (plane -> worker).

Both send ``Authorization: Bearer <GATEWAY_API_TOKEN>`` and JSON bodies of the models in
:mod:`gateway.fleet.models`. Errors come back as ``{"error": {"code", "message"}}`` and are translated here
into :mod:`gateway.fleet.errors`, so no httpx exception leaves this module. Retries are bounded: connect
errors, timeouts and 5xx answers are retried with exponential backoff; 4xx answers never are.

Endpoints (all under ``/internal/v1``)::

    control plane: POST workers/register, POST workers/{id}/heartbeat, POST admit, POST events
    worker:        POST calls/{id}/hangup|transfer|dtmf, POST originate, POST drain, GET calls
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx
import orjson
from pydantic import TypeAdapter, ValidationError

from gateway.fleet.compat import describe, parse_answer
from gateway.fleet.errors import CallNotFoundError, CommandRejectedError, LinkAuthError, LinkError, WorkerNotFoundError
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    AgentCommand,
    CallSnapshot,
    DrainRequest,
    DtmfRequest,
    HangupRequest,
    OriginateCommand,
    OriginateRequest,
    ReportRequest,
    TransferLine,
    TransferRequest,
    WarmTransferRequest,
    WorkerEvent,
    WorkerInfo,
)
from gateway.slices import Slices

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "/internal/v1"
_SNAPSHOTS = TypeAdapter(list[CallSnapshot])


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Bounded retries: at most ``attempts`` tries, sleeping base * 2**n (capped) between them."""

    attempts: int = 4
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0
    timeout_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_delay_s, self.base_delay_s * (2**attempt)))


class _JsonClient:
    """One httpx.AsyncClient, the bearer token, the retry loop and the error translation.

    With several base URLs (replicas of one service), a request that fails to connect or gets a 5xx is tried
    on the next one at once, and the client stays with the one that answered; the policy's back-off applies
    once every URL has failed in turn."""

    def __init__(
        self, base_url: str | Sequence[str], token: str | None, policy: RetryPolicy, client: httpx.AsyncClient | None
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=policy.timeout_s)
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("no base URL")
        self._base_urls = [url.rstrip("/") + INTERNAL_PREFIX for url in urls]
        self._current = 0
        self._headers = headers
        self._policy = policy

    @property
    def base_url(self) -> str:
        """The base URL requests go to now (the last one that answered)."""
        return self._base_urls[self._current]

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        # orjson: a heartbeat of 400 calls is 375 kB of JSON, 7.6 ms through the stdlib encoder httpx's json=
        # uses and 0.8 ms here, on the loop that runs the worker's media tick.
        content, headers = None, self._headers
        if body is not None:
            content, headers = orjson.dumps(body), {**self._headers, "Content-Type": "application/json"}
        last_error: LinkError | None = None
        replicas = len(self._base_urls)
        rounds = 0
        for attempt in range(max(1, self._policy.attempts, replicas)):
            if attempt and attempt % replicas == 0:  # every replica failed once: back off
                await asyncio.sleep(self._policy.delay(rounds))
                rounds += 1
            if attempt:
                self._current = (self._current + 1) % replicas
            url = self._base_urls[self._current] + path
            try:
                response = await self._client.request(
                    method, url, content=content, headers=headers, timeout=self._policy.timeout_s
                )
            except httpx.HTTPError as exc:  # connect, read, timeout, protocol
                last_error = LinkError(f"{method} {url}: {type(exc).__name__}: {exc}")
                log.debug("fleet link attempt %d failed: %s", attempt + 1, last_error)
                continue
            if response.status_code >= 500:
                last_error = LinkError(f"{method} {url}: HTTP {response.status_code}: {_message(response)}")
                log.debug("fleet link attempt %d failed: %s", attempt + 1, last_error)
                continue
            return self._decode(method, url, response)
        assert last_error is not None
        raise last_error

    def _decode(self, method: str, url: str, response: httpx.Response) -> Any:
        status = response.status_code
        if status == 204:
            return None
        if status == 401:
            raise LinkAuthError(f"{method} {url}: token rejected (GATEWAY_API_TOKEN differs?)")
        if status == 404:
            code = _code(response)
            if code == "call_not_found":
                raise CallNotFoundError(_detail(response, "call_id"))
            if code == "worker_not_found":
                raise WorkerNotFoundError(_detail(response, "worker_id"))
            raise LinkError(f"{method} {url}: HTTP 404: {_message(response)}")
        if status == 409:
            raise CommandRejectedError(_message(response))
        if status >= 400:
            raise LinkError(f"{method} {url}: HTTP {status}: {_message(response)}")
        try:
            return response.json()
        except ValueError as exc:
            raise LinkError(f"{method} {url}: answer is not JSON") from exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _error_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def _code(response: httpx.Response) -> str:
    return str(_error_body(response).get("code", ""))


def _message(response: httpx.Response) -> str:
    return str(_error_body(response).get("message", response.text[:200]))


def _detail(response: httpx.Response, key: str) -> str:
    return str(_error_body(response).get(key, ""))


def _parse(model: Any, data: Any, what: str, logged: dict[str, frozenset[str]]) -> Any:
    """The answer as ``model``; fields a newer control plane added are ignored, and logged once (``logged``: the
    ones already logged, by answer, since such a plane answers every heartbeat and admission with them)."""
    try:
        parsed, unknown = parse_answer(model, data)
    except ValidationError as exc:
        raise LinkError(f"{what}: malformed answer: {describe(exc)}") from exc
    if unknown and logged.get(what) != frozenset(unknown):
        logged[what] = frozenset(unknown)
        log.warning(
            "the control plane's %s answer has fields this worker does not know (the plane runs a newer version); "
            "they are ignored: %s",
            what,
            ", ".join(unknown),
        )
    return parsed


class HttpControlLink:
    """ControlLink over HTTP to the control plane's ``/internal/v1`` endpoints (``gateway worker --control``).

    ``control_url`` may list several control-plane processes, comma-separated (replicas sharing one Redis):
    the link fails over between them, so a worker keeps heartbeating while one of them restarts."""

    def __init__(
        self,
        control_url: str,
        token: str | None,
        *,
        policy: RetryPolicy | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        urls = [url.strip() for url in control_url.split(",") if url.strip()]
        self._http = _JsonClient(urls, token, policy or RetryPolicy(), client)
        self._logged_unknown: dict[str, frozenset[str]] = {}

    @property
    def control_url(self) -> str:
        """The control-plane process the link talks to now."""
        return self._http.base_url.removesuffix(INTERNAL_PREFIX)

    async def register(self, info: WorkerInfo) -> WorkerInfo:
        data = await self._http.request("POST", "/workers/register", info.model_dump(mode="json"))
        return _parse(WorkerInfo, data, "register", self._logged_unknown)  # type: ignore[no-any-return]

    async def heartbeat(self, info: WorkerInfo, calls: Sequence[CallSnapshot]) -> WorkerInfo:
        # HeartbeatRequest's JSON, one call at a time with the loop let in between (400 calls: 2 ms in one go).
        slices = Slices()
        dumped = []
        for call in calls:
            dumped.append(call.model_dump(mode="json", by_alias=True))
            await slices.next()
        body = {"info": info.model_dump(mode="json", by_alias=True), "calls": dumped}
        data = await self._http.request("POST", f"/workers/{info.id}/heartbeat", body)
        return _parse(WorkerInfo, data, "heartbeat", self._logged_unknown)  # type: ignore[no-any-return]

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision:
        if request.call_id is None:
            # A fixed id makes the retried request idempotent on the plane.
            request = request.model_copy(update={"call_id": f"c-{uuid4().hex[:16]}"})
        data = await self._http.request("POST", "/admit", request.model_dump(mode="json"))
        return _parse(AdmissionDecision, data, "admit", self._logged_unknown)  # type: ignore[no-any-return]

    async def report(self, events: Sequence[WorkerEvent]) -> None:
        if not events:
            return
        body = ReportRequest(events=list(events)).model_dump(mode="json", by_alias=True)
        await self._http.request("POST", "/events", body)

    async def aclose(self) -> None:
        await self._http.aclose()


class HttpWorkerCommands:
    """WorkerCommands forwarded over HTTP to a worker's :func:`gateway.fleet.worker_api` router.

    Commands are tried once by default (an operator retries a hang-up; a duplicated originate would
    ring twice); pass a RetryPolicy to change that.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        policy: RetryPolicy | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self._http = _JsonClient(url, token, policy or RetryPolicy(attempts=1, timeout_s=5.0), client)

    async def hang_up(self, call_id: str, reason: str) -> None:
        await self._http.request("POST", f"/calls/{call_id}/hangup", HangupRequest(reason=reason).model_dump())

    async def transfer(self, call_id: str, target: str) -> None:
        await self._http.request("POST", f"/calls/{call_id}/transfer", TransferRequest(target=target).model_dump())

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        await self._http.request("POST", f"/calls/{call_id}/dtmf", DtmfRequest(digits=digits).model_dump())

    async def hold(self, call_id: str, held: bool) -> None:
        await self._http.request("POST", f"/calls/{call_id}/{'hold' if held else 'unhold'}", {})

    async def warm_transfer(self, call_id: str, request: WarmTransferRequest) -> TransferLine:
        data = await self._http.request("POST", f"/calls/{call_id}/warm_transfer", request.model_dump(mode="json"))
        return TransferLine.model_validate(data)

    async def warm_transfer_join(self, call_id: str) -> TransferLine:
        data = await self._http.request("POST", f"/calls/{call_id}/warm_transfer/join", {})
        return TransferLine.model_validate(data)

    async def command_agent(self, call_id: str, command: AgentCommand) -> None:
        await self._http.request("POST", f"/calls/{call_id}/agent", command.model_dump(mode="json"))

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        body = OriginateCommand(request=request, admission=admission).model_dump(mode="json")
        data = await self._http.request("POST", "/originate", body)
        if not isinstance(data, dict) or not isinstance(data.get("call_id"), str):
            raise LinkError("originate: malformed answer")
        return str(data["call_id"])

    async def drain(self, exit_when_empty: bool, deadline_s: float | None = None) -> None:
        body = DrainRequest(exit_when_empty=exit_when_empty, deadline_s=deadline_s)
        await self._http.request("POST", "/drain", body.model_dump())

    async def snapshot(self) -> list[CallSnapshot]:
        data = await self._http.request("GET", "/calls")
        try:
            return _SNAPSHOTS.validate_python(data, extra="ignore")  # a newer worker's fields are left out
        except ValidationError as exc:
            raise LinkError(f"snapshot: malformed answer: {describe(exc)}") from exc

    async def aclose(self) -> None:
        await self._http.aclose()
