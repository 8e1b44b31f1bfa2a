"""Event webhooks: subscriptions, the feed that puts events in the outbox, and the deliverer that sends them.

At-least-once, through the outbox table in the database of calls (:mod:`gateway.records.outbox`):

* :class:`WebhookFeed` takes the plane's live events (``offer``, never waits), buffers them (bounded) and inserts
  them in batches from its own task; an ended call's events are built by ``ended_events`` and inserted by the
  :class:`gateway.records.RecordWriter` in the record's own transaction, after the feed is flushed, so a call's
  events keep their order.
* :class:`WebhookDeliverer` (one owned task, one control-plane process at a time through the store's lease) sends
  the oldest pending event of each (endpoint, call), signed (Standard Webhooks; the ``webhook-id`` is the row's,
  the same on every attempt), and retries a failure with exponential backoff until ``max_attempts``. A restart
  finds the pending rows where it left them; an event whose answer was lost is sent again, with the same id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import orjson
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.control.config import GatewayConfig
from gateway.control.signing import WebhookSigner, new_message_id
from gateway.control.webhook_events import WEBHOOK_EVENT_TYPES, WebhookEvent, from_record, from_stream
from gateway.fleet.models import CallSnapshot
from gateway.observability import (
    WEBHOOK_ATTEMPTS_TOTAL,
    WEBHOOK_DELIVERED_TOTAL,
    WEBHOOK_EVENTS_DROPPED_TOTAL,
    WEBHOOK_FAILED_TOTAL,
    WEBHOOK_PENDING,
)
from gateway.records.database import Database
from gateway.records.errors import DatabaseError
from gateway.records.outbox import (
    Delivery,
    OutboxEvent,
    count_pending,
    pending_heads,
    record_attempt,
    write_events,
)

log = logging.getLogger(__name__)

# Calls whose call.answered was made, remembered so each later snapshot does not offer it again (the outbox's
# unique key would drop it anyway): bounded, the oldest forgotten first.
_ANSWERED_MEMORY = 100_000


class EventWebhookSettings(BaseSettings):
    """Event webhooks (docs/operations.md, "Event webhooks"): one endpoint here, more as ``[[webhooks]]`` in the
    routes file; how deliveries are retried, for all of them. Requests are signed with `GATEWAY_WEBHOOK_SECRET`
    unless an endpoint has its own."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_EVENT_WEBHOOK_", frozen=True, extra="ignore")

    url: str = Field(
        default="",
        pattern=r"^(https?://.+)?$",
        description="An endpoint (named `default`) that gets the event webhooks; unset: none.",
    )
    events: str = Field(
        default="",
        description="The events `GATEWAY_EVENT_WEBHOOK_URL` gets, comma-separated (e.g. `call.started,call.ended`); "
        "empty: all of them.",
    )
    max_attempts: int = Field(
        default=15, ge=1, le=1000, description="Attempts per event before its delivery is marked failed."
    )
    backoff_min_s: float = Field(
        default=1.0, gt=0.0, le=3600.0, description="Wait after an event's first failed attempt; doubled each time."
    )
    backoff_max_s: float = Field(
        default=300.0, gt=0.0, le=86_400.0, description="The longest wait between two attempts of an event."
    )
    timeout_s: float = Field(default=10.0, gt=0.0, le=300.0, description="How long an attempt waits for the answer.")
    concurrency: int = Field(
        default=16, ge=1, le=1000, description="Requests in flight at once (each to a different call or endpoint)."
    )

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: str) -> str:
        unknown = {name.strip() for name in value.split(",") if name.strip()} - set(WEBHOOK_EVENT_TYPES)
        if unknown:
            raise ValueError(f"names {', '.join(sorted(unknown))}: the events are {', '.join(WEBHOOK_EVENT_TYPES)}")
        return value

    buffer: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        description="Live events held for the outbox while the database is down; past this the oldest is dropped, "
        "counted in `gateway_webhook_events_dropped_total`.",
    )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A subscribed application: where its events go, which, and how they are signed (None: unsigned)."""

    name: str
    url: str
    events: frozenset[str]
    signer: WebhookSigner | None


def endpoints_of(config: GatewayConfig, settings: EventWebhookSettings, secret: str | None) -> tuple[Endpoint, ...]:
    """The routes file's ``[[webhooks]]`` and the settings' endpoint, with their signers."""
    found: list[Endpoint] = []
    for endpoint in config.webhooks:
        key = endpoint.secret or secret
        signer = WebhookSigner(key) if key else None
        found.append(Endpoint(endpoint.name, endpoint.url, frozenset(endpoint.events), signer))
    if settings.url:
        events = frozenset(name.strip() for name in settings.events.split(",") if name.strip())
        signer = WebhookSigner(secret) if secret else None
        found.append(Endpoint("default", settings.url, events or frozenset(WEBHOOK_EVENT_TYPES), signer))
    if any(endpoint.signer is None for endpoint in found):
        log.warning("event webhooks go unsigned to some endpoints: set GATEWAY_WEBHOOK_SECRET or their secret")
    return tuple(found)


def body_of(event: WebhookEvent) -> str:
    """The JSON a receiver gets: the Standard Webhooks envelope (type, timestamp, data)."""
    stamp = datetime.fromtimestamp(event.time, tz=UTC).isoformat().replace("+00:00", "Z")
    return orjson.dumps({"type": event.type, "timestamp": stamp, "data": event.data}).decode()


def backoff_s(attempts: int, settings: EventWebhookSettings) -> float:
    """The wait after the ``attempts``-th failed attempt: doubling from the minimum, capped at the maximum."""
    return float(min(settings.backoff_min_s * 2 ** min(attempts - 1, 60), settings.backoff_max_s))


class WebhookFeed:
    """Turns the plane's events and ended calls into outbox rows, one per subscribed endpoint."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        capacity: int = 100_000,
        clock: Callable[[], float] = time.time,
        on_written: Callable[[], None] = lambda: None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.capacity = capacity
        self.database: Database | None = None
        self._clock = clock
        self._on_written = on_written
        self._buffer: deque[OutboxEvent] = deque()
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self.dropped = 0

    def attach(self, database: Database) -> None:
        self.database = database
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._buffer)

    def _rows(self, events: Iterable[WebhookEvent]) -> list[OutboxEvent]:
        now = self._clock()
        return [
            OutboxEvent(
                msg_id=new_message_id(),
                endpoint=endpoint.name,
                call_id=event.call_id,
                event_type=event.type,
                dedupe_key=event.dedupe_key,
                body=body_of(event),
                created_at=now,
            )
            for event in events
            for endpoint in self.endpoints
            if event.type in endpoint.events
        ]

    def offer(self, event_type: str, data: dict[str, object], at: float, *, event_id: int = 0) -> None:
        """A live event of the plane (never waits): its webhook events are buffered for the outbox."""
        if not self.endpoints:
            return
        call_id = str(data.get("id") or "")
        answered_known = call_id in self._answered
        events = from_stream(event_type, dict(data), at, event_id=event_id, answered_known=answered_known)
        if any(event.type == "call.answered" for event in events):
            self._answered[call_id] = None
            if len(self._answered) > _ANSWERED_MEMORY:
                self._answered.popitem(last=False)
        if event_type == "call.ended":
            self._answered.pop(call_id, None)
        for row in self._rows(events):
            if len(self._buffer) >= self.capacity:
                self._drop_oldest()
            self._buffer.append(row)
        if events:
            self._wake.set()

    def ended_events(self, call: CallSnapshot, profile: str) -> list[OutboxEvent]:
        """An ended call's events, for the record writer to insert with the record."""
        if not self.endpoints:
            return []
        return self._rows(from_record(call, profile))

    async def flush(self, *, batch: int = 500) -> None:
        """Insert every buffered event, ``batch`` per transaction; on a failure the rest stay buffered, in order,
        and it raises."""
        async with self._lock:
            while self._buffer:
                if self.database is None:
                    raise DatabaseError("the database of calls is not open yet")
                # Taken out while written: offers meanwhile append (or drop the oldest) without touching these.
                taken = [self._buffer.popleft() for _ in range(min(batch, len(self._buffer)))]
                try:
                    await write_events(self.database, taken)
                except BaseException:
                    self._buffer.extendleft(reversed(taken))
                    while len(self._buffer) > self.capacity:
                        self._drop_oldest()
                    raise
                self._on_written()

    def _drop_oldest(self) -> None:
        self._buffer.popleft()
        self.dropped += 1
        WEBHOOK_EVENTS_DROPPED_TOTAL.inc()
        log.error("webhook event buffer full (%d): the oldest event is dropped", self.capacity)

    def events_written(self) -> None:
        """The record writer inserted an ended call's events: time to deliver them."""
        self._on_written()

    async def run(self, *, backoff_min_s: float = 0.1, backoff_max_s: float = 10.0) -> None:
        """Insert buffered events as they come, in batches, until cancelled."""
        backoff = backoff_min_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("webhook events wait for the database (%d buffered): %s", len(self._buffer), exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, backoff_max_s)
                self._wake.set()
                continue
            backoff = backoff_min_s


Lease = Callable[[float], Awaitable[bool]]


class WebhookDeliverer:
    """Sends the outbox's due events; ``run()`` is its one task."""

    def __init__(
        self,
        database: Database,
        endpoints: Sequence[Endpoint],
        settings: EventWebhookSettings,
        *,
        clock: Callable[[], float] = time.time,
        lease: Lease | None = None,
        poll_s: float = 2.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.database = database
        self.endpoints = {endpoint.name: endpoint for endpoint in endpoints}
        self.settings = settings
        self.poll_s = poll_s
        self._clock = clock
        self._lease = lease
        self._client = client
        self._wake = asyncio.Event()
        self._inflight: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._counted_at = float("-inf")
        # Rows whose attempt ended during this pass: the pass's read may predate their update, so it must not
        # start them again from what it read.
        self._settled: set[int] = set()

    def wake(self) -> None:
        """New events are in the outbox (or one was made due again): look now."""
        self._wake.set()

    async def run(self) -> None:
        owns_client = self._client is None
        client = self._client or httpx.AsyncClient(timeout=self.settings.timeout_s, follow_redirects=False)
        backoff = 0.5
        try:
            while True:
                try:
                    wait = await self._pass(client)
                    backoff = 0.5
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("webhook deliveries wait for the database: %s", exc)
                    wait = backoff
                    backoff = min(backoff * 2, 30.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.0))
                self._wake.clear()
        finally:
            tasks = list(self._inflight.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if owns_client:
                await client.aclose()

    async def _pass(self, client: httpx.AsyncClient) -> float:
        """Start the due deliveries there is room for; how long until the next one is due."""
        if self._lease is not None and not await self._lease(self.poll_s * 3):
            return self.poll_s
        now = self._clock()
        if now - self._counted_at >= 1.0:  # the gauge, at most once a second however busy the loop is
            WEBHOOK_PENDING.set(await count_pending(self.database))
            self._counted_at = now
        wait = self.poll_s
        self._settled.clear()
        for head in await pending_heads(self.database, limit=self.settings.concurrency * 8):
            key = (head.endpoint, head.call_id)
            if key in self._inflight or head.id in self._settled:
                continue
            due_in = (head.next_attempt_at or 0.0) - now
            if due_in > 0:
                wait = min(wait, due_in)
                continue
            if len(self._inflight) >= self.settings.concurrency:
                break  # a finishing delivery wakes the loop
            task = asyncio.create_task(self._deliver(client, head), name=f"webhook-{head.id}")
            self._inflight[key] = task
            task.add_done_callback(lambda _, key=key, row=head.id: self._done(key, row))
        return wait

    def _done(self, key: tuple[str, str], row: int) -> None:
        self._inflight.pop(key, None)
        self._settled.add(row)
        self._wake.set()

    async def _deliver(self, client: httpx.AsyncClient, head: Delivery) -> None:
        try:
            await self._attempt(client, head)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook delivery %d could not be recorded; it is tried again", head.id)

    async def _attempt(self, client: httpx.AsyncClient, head: Delivery) -> None:
        endpoint = self.endpoints.get(head.endpoint)
        now = self._clock()
        attempts = head.attempts + 1
        if endpoint is None:
            error = f"endpoint {head.endpoint!r} is not configured any more"
            await record_attempt(
                self.database, head.id, at=now, status="failed", next_at=None, status_code=None, error=error
            )
            WEBHOOK_FAILED_TOTAL.inc()
            return
        body = head.body.encode()
        headers = {"content-type": "application/json", "user-agent": "voice-gateway-webhooks"}
        if endpoint.signer is not None:
            headers.update(endpoint.signer.headers(body, msg_id=head.msg_id, at=now))
        else:
            headers.update({"webhook-id": head.msg_id, "webhook-timestamp": str(int(now))})
        status_code: int | None = None
        try:
            response = await client.post(endpoint.url, content=body, headers=headers, timeout=self.settings.timeout_s)
            status_code = response.status_code
            error = "" if response.is_success else f"HTTP {status_code}: {response.text[:200]}"
            outcome = "ok" if response.is_success else "http_error"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            outcome = "unreachable"
        WEBHOOK_ATTEMPTS_TOTAL.labels(outcome=outcome).inc()
        done = self._clock()
        if outcome == "ok":
            await record_attempt(
                self.database, head.id, at=done, status="delivered", next_at=None, status_code=status_code, error=""
            )
            WEBHOOK_DELIVERED_TOTAL.inc()
            return
        if attempts >= self.settings.max_attempts:
            log.error(
                "webhook %s to %s (call %s) failed %d times, given up: %s",
                head.event_type,
                endpoint.name,
                head.call_id,
                attempts,
                error,
            )
            await record_attempt(
                self.database, head.id, at=done, status="failed", next_at=None, status_code=status_code, error=error
            )
            WEBHOOK_FAILED_TOTAL.inc()
            return
        delay = backoff_s(attempts, self.settings)
        log.info(
            "webhook %s to %s failed (%s); attempt %d in %.1f s",
            head.event_type,
            endpoint.name,
            error,
            attempts + 1,
            delay,
        )
        await record_attempt(
            self.database,
            head.id,
            at=done,
            status="pending",
            next_at=done + delay,
            status_code=status_code,
            error=error,
        )


class Webhooks:
    """The event webhooks for an app's life: the feed from the start (events wait in it while the database opens),
    the deliverer once the database is open. ``database`` is None until then."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        settings: EventWebhookSettings,
        *,
        clock: Callable[[], float] = time.time,
        lease: Lease | None = None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.settings = settings
        self.database: Database | None = None
        self.deliverer: WebhookDeliverer | None = None
        self._clock = clock
        self._lease = lease
        self.feed = WebhookFeed(self.endpoints, capacity=settings.buffer, clock=clock, on_written=self.wake)

    def wake(self) -> None:
        if self.deliverer is not None:
            self.deliverer.wake()

    def start(self, database: Database) -> list[asyncio.Task[None]]:
        """The database opened: the tasks that insert and deliver (none when no endpoint is subscribed)."""
        self.database = database
        if not self.endpoints:
            return []
        self.feed.attach(database)
        self.deliverer = WebhookDeliverer(database, self.endpoints, self.settings, clock=self._clock, lease=self._lease)
        return [
            asyncio.create_task(self.feed.run(), name="webhooks-feed"),
            asyncio.create_task(self.deliverer.run(), name="webhooks-deliverer"),
        ]

    def stop(self) -> None:
        self.database = None
        self.deliverer = None
