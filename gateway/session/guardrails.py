"""Output guardrails at run time: the agent's transcript checked at a debounce, one trip per response.

Built-in checks (:mod:`gateway.session.guardrail_checks`) are pure and cheap: they run inline where the transcript
delta is handled, so a trip has stopped the agent's audio before the next media tick. HTTP moderation hooks run as
owned tasks, never in the tick or the provider listener: one request in flight per hook and agent item; a check
point reached meanwhile is folded into one more request with the text by then. A check that raises or times out
is reported through ``on_error`` (logged, an ErrorOccurred event) and skipped; it never ends the call.

The first verdict of a response wins: later ones for it (another guardrail, another check point, an HTTP answer
arriving late) are ignored, so the session interrupts once and asks for one follow-up response.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.session.config import GuardrailConfig
from gateway.session.errors import GuardrailError
from gateway.session.events import GuardrailTripped
from gateway.session.guardrail_checks import BlockedTerms, Debounce, PiiCheck, Verdict
from gateway.session.tasks import TaskOwner
from gateway.session.turns import Cut

log = logging.getLogger(__name__)


def _ignore_trip(trip: Trip) -> None:
    pass


def _ignore_error(where: str, exc: BaseException) -> None:
    pass


_OVERLAP = 256  # characters re-read before the new text at each check: longer matches than this may be missed
_TRIPPED_MEMORY = 64  # responses and items remembered as tripped; their late text arrives within the response


@dataclass(frozen=True, slots=True, kw_only=True)
class Trip:
    """A guardrail's verdict on a response. ``received_at``: the session clock when the text it judged
    reached the gateway."""

    guardrail: str
    reason: str
    response_id: str
    item_id: str
    received_at: float


@dataclass(slots=True, kw_only=True)
class _Item:
    key: str  # the response (or, outside a response, the item) a trip is counted against
    response_id: str
    item_id: str
    debounce: Debounce
    text: str = ""
    checked: int = 0  # length of the text at the last check
    received_at: float = 0.0
    asking: set[str] = field(default_factory=set)  # HTTP hooks with a request in flight
    again: set[str] = field(default_factory=set)  # ... and those with a check point reached meanwhile


class Guardrails:
    """The guardrails of one call. ``on_trip`` is called at most once per response."""

    def __init__(
        self,
        configs: tuple[GuardrailConfig, ...],
        *,
        every_chars: int,
        call_id: str,
        tasks: TaskOwner,
        clock: Callable[[], float],
        on_trip: Callable[[Trip], None],
        on_error: Callable[[str, BaseException], None],
        http_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._every = every_chars
        self._call_id = call_id
        self._tasks = tasks
        self._clock = clock
        self._on_trip = on_trip
        self._on_error = on_error
        self._transport = http_transport
        self._client: httpx.AsyncClient | None = None
        self._checks: list[tuple[str, BlockedTerms | PiiCheck]] = []
        self._hooks: list[GuardrailConfig] = []
        for config in configs:
            if config.kind == "blocked":
                self._checks.append((config.name, BlockedTerms(phrases=config.phrases, patterns=config.patterns)))
            elif config.kind == "pii":
                self._checks.append((config.name, PiiCheck(config.pii)))
            else:
                self._hooks.append(config)
        self._items: dict[str, _Item] = {}
        self._tripped: deque[str] = deque(maxlen=_TRIPPED_MEMORY)
        self.trips = 0

    @property
    def enabled(self) -> bool:
        return bool(self._checks or self._hooks)

    def feed(self, *, response_id: str | None, item_id: str, text: str, final: bool) -> None:
        """An agent transcript delta (``final`` False) or the item's whole text (True)."""
        key = response_id or f"item:{item_id}"
        if key in self._tripped or f"item:{item_id}" in self._tripped:
            return  # its later text (the heard prefix an adapter reports after the truncate, say) is not judged
        item = self._items.get(item_id)
        if item is None:
            # Items stream one after another: an earlier item is done being checked.
            self._items.clear()
            item = self._items[item_id] = _Item(
                key=key, response_id=response_id or "", item_id=item_id, debounce=Debounce(self._every)
            )
        item.text = text if final else item.text + text
        item.received_at = self._clock()
        if not item.debounce.due(text if not final else "", final=final):
            return
        # The text since the last check, with enough before it for a match that straddles the last check point:
        # each check costs what arrived since, not the whole item again.
        window = item.text if final else item.text[max(0, item.checked - _OVERLAP) :]
        item.checked = len(item.text)
        for name, check in self._checks:
            try:
                verdict = check.check(window)
            except Exception as exc:  # a check is skipped, never fatal to the call
                self._on_error(f"guardrail {name}", exc)
                continue
            if verdict is not None:
                self._trip(item, name, verdict, item.received_at)
                return
        for hook in self._hooks:
            self._ask(item, hook)

    def release(self) -> None:
        """The call has ended: drop the callbacks into the session (so reference counting frees the call, ADR 0006)."""
        self._on_trip = _ignore_trip
        self._on_error = _ignore_error
        self._items.clear()

    async def aclose(self) -> None:
        self._items.clear()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # ------------------------------------------------------------------------------------ internals

    def _trip(self, item: _Item, name: str, verdict: Verdict, received_at: float) -> None:
        if item.key in self._tripped:
            return
        self._tripped.append(item.key)
        self._tripped.append(f"item:{item.item_id}")
        self.trips += 1
        self._items.pop(item.item_id, None)
        log.info("call %s: guardrail %s tripped on %s: %s", self._call_id, name, item.key, verdict.reason)
        self._on_trip(
            Trip(
                guardrail=name,
                reason=verdict.reason,
                response_id=item.response_id,
                item_id=item.item_id,
                received_at=received_at,
            )
        )

    def _ask(self, item: _Item, hook: GuardrailConfig) -> None:
        if hook.name in item.asking:
            item.again.add(hook.name)
            return
        item.asking.add(hook.name)
        self._tasks.spawn(self._moderate(item, hook), name=f"guardrail:{hook.name}")

    async def _moderate(self, item: _Item, hook: GuardrailConfig) -> None:
        try:
            while item.key not in self._tripped:
                item.again.discard(hook.name)
                text, received_at = item.text, item.received_at
                try:
                    verdict = await self._post(hook, item, text)
                except (GuardrailError, TimeoutError, httpx.HTTPError) as exc:
                    self._on_error(f"guardrail {hook.name}", exc)
                    return
                if verdict is not None:
                    self._trip(item, hook.name, verdict, received_at)
                    return
                if hook.name not in item.again:
                    return
        finally:
            item.asking.discard(hook.name)

    async def _post(self, hook: GuardrailConfig, item: _Item, text: str) -> Verdict | None:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, follow_redirects=False)
        body = {
            "call_id": self._call_id,
            "guardrail": hook.name,
            "response_id": item.response_id,
            "item_id": item.item_id,
            "text": text,
        }
        try:
            # httpx bounds each network step; the outer bound covers the whole exchange.
            async with asyncio.timeout(hook.timeout_s):
                response = await self._client.post(hook.url, json=body, timeout=hook.timeout_s)
        except TimeoutError as exc:
            raise GuardrailError(f"{hook.name} timed out after {hook.timeout_s:g} s") from exc
        if not response.is_success:
            raise GuardrailError(f"{hook.name} answered HTTP {response.status_code}")
        try:
            answer: Any = response.json()
        except ValueError as exc:
            raise GuardrailError(f"{hook.name} answered with a body that is not JSON") from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("flagged"), bool):
            raise GuardrailError(f'{hook.name} answered without a boolean "flagged"')
        if not answer["flagged"]:
            return None
        reason = answer.get("reason")
        return Verdict(reason=str(reason)[:200] if reason else "flagged by moderation", start=0)


def tripped_event(
    trip: Trip, cut: Cut | None, *, followed_up: bool, stopped_at: float | None, stopped_frame: int | None
) -> GuardrailTripped:
    return GuardrailTripped(
        guardrail=trip.guardrail,
        reason=trip.reason,
        response_id=trip.response_id or (cut.response_id if cut is not None else ""),
        item_id=trip.item_id,
        items=cut.items if cut is not None else (),
        cancelled=cut is not None and cut.cancelled,
        truncated=cut is not None and cut.truncated,
        followed_up=followed_up,
        received_at=trip.received_at,
        stopped_at=stopped_at,
        stopped_frame=stopped_frame,
    )
