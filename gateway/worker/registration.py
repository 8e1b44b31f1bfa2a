"""The worker's registrations with its trunks: its own contact bound to each trunk's AOR (RFC 3261 §10.2).

For each trunk with ``register = true`` (``GATEWAY_TRUNK_REGISTER=true``: the trunk ``default``) every worker
REGISTERs its Contact (its advertised SIP address, with an RFC 5626 ``+sip.instance`` made from its worker id,
so each worker's contact is its own and a restarted worker replaces its old binding) for the AOR at the
registrar, which then forks or picks among the workers' contacts.
The protocol is gateway/sip/registration.py's, run on the worker's endpoint; this module owns the rest:

* `registration_config` (gateway/worker/trunk_config.py): the trunks (validated at start-up, with messages
  naming the ``GATEWAY_*`` variables or the routes file's keys) as `RegistrationConfig`s;
* `TrunkRegistration`, one per trunk: starts the client with the worker, turns its events into log lines
  and metrics (``gateway_trunk_registered{trunk}``, ``gateway_trunk_register_total{trunk,outcome}``), gives the
  heartbeat its `TrunkRegistration` snapshot (``/v1/workers``), and removes the binding when the worker drains
  (so the trunk sends its calls to the other workers) and when it shuts down, waiting at most
  ``GATEWAY_TRUNK_UNREGISTER_TIMEOUT_S`` for the registrar: a dead registrar never holds a shutdown;
* `TrunkRegistrations`, held by the worker: all of them, each event routed to its own by registrar and AOR.

The password is a ``SecretStr`` in the settings and is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.fleet.models import TrunkRegistration as TrunkRegistrationModel
from gateway.fleet.models import TrunkRegistrationState
from gateway.fleet.trunks import DEFAULT_TRUNK
from gateway.observability import TRUNK_REGISTER_TOTAL, TRUNK_REGISTERED
from gateway.sip.events import SipEvent, TrunkRegistered, TrunkRegistrationFailed, TrunkUnregistered
from gateway.sip.registration import RegistrationClient, RegistrationConfig, RegState
from gateway.worker.ports import SipSignalling
from gateway.worker.trunk_config import instance_id, registration_config

__all__ = ["REGISTRATION_EVENTS", "TrunkRegistration", "TrunkRegistrations", "instance_id", "registration_config"]

log = logging.getLogger(__name__)

REGISTRATION_EVENTS = (TrunkRegistered, TrunkRegistrationFailed, TrunkUnregistered)
_STATES: dict[RegState, TrunkRegistrationState] = {
    RegState.IDLE: "registering",
    RegState.REGISTERING: "registering",
    RegState.REGISTERED: "registered",
    RegState.REFRESHING: "refreshing",
    RegState.FAILED: "failed",
    RegState.STOPPING: "unregistering",
    RegState.UNREGISTERING: "unregistering",
    RegState.STOPPED: "unregistered",
}


class TrunkRegistration:
    """The registration of one worker (a no-op when ``config`` is None), built with the SIP signalling port, the
    registration the settings ask for, and ``on_change``: called on every outcome (the heartbeat carries it)."""

    def __init__(
        self,
        signalling: SipSignalling,
        config: RegistrationConfig | None,
        *,
        worker_id: str,
        unregister_timeout_s: float,
        on_change: Callable[[], None],
        trunk: str = DEFAULT_TRUNK,
    ) -> None:
        self._signalling = signalling
        self._worker_id = worker_id
        self.trunk = trunk
        self._unregister_timeout_s = unregister_timeout_s
        self._on_change = on_change
        self.config = config
        self.client: RegistrationClient | None = None
        self._ended = asyncio.Event()
        self._registered = TRUNK_REGISTERED.labels(worker_id, trunk)
        self._outcomes = {
            outcome: TRUNK_REGISTER_TOTAL.labels(worker_id, trunk, outcome)
            for outcome in (
                "registered",
                "refreshed",
                "contact_missing",
                "rejected",
                "auth_rejected",
                "timeout",
                "unregistered",
                "unregister_failed",
            )
        }
        if self.config is not None:
            self._registered.set(0)

    def start(self) -> None:
        """Send the first REGISTER (the worker's SIP transport is up)."""
        if self.config is None or self.client is not None:
            return
        self.client = self._signalling.register(self.config)
        log.info(
            "worker %s: trunk %s: registering %s for %s at %s (auth user %s)",
            self._worker_id,
            self.trunk,
            self.client.contact,
            self.config.aor,
            self.config.registrar,
            self.config.username or "none",
        )

    def begin_unregister(self, reason: str) -> None:
        """Remove our binding now (drain, shutdown); the outcome is logged when it comes."""
        client = self.client
        if client is None or client.state is RegState.STOPPED:
            return
        if client.state not in (RegState.STOPPING, RegState.UNREGISTERING):
            log.info(
                "worker %s: trunk %s: removing its contact from %s (%s)",
                self._worker_id,
                self.trunk,
                client.config.registrar,
                reason,
            )
        self._signalling.unregister(client, within=self._unregister_timeout_s)

    async def unregister(self, reason: str) -> None:
        """Remove our binding and wait for the outcome, at most the unregister timeout (plus a little)."""
        if self.client is None:
            return
        self.begin_unregister(reason)
        try:
            await asyncio.wait_for(self._ended.wait(), timeout=self._unregister_timeout_s + 1.0)
        except TimeoutError:  # the core gives up by itself first; this only guards against a stalled loop
            log.warning(
                "worker %s: trunk %s: the removal of its trunk registration did not finish in time",
                self._worker_id,
                self.trunk,
            )

    def on_events(self, events: list[SipEvent]) -> None:
        for event in events:
            if isinstance(event, TrunkRegistered):
                self._on_registered(event)
            elif isinstance(event, TrunkRegistrationFailed):
                self._on_failed(event)
            elif isinstance(event, TrunkUnregistered):
                self._on_unregistered(event)
        self._on_change()

    def info(self) -> TrunkRegistrationModel | None:
        """The snapshot for the heartbeat (times on the worker's wall clock)."""
        client = self.client
        if client is None:
            return None
        status = client.status()
        offset = time.time() - self._signalling.now()
        return TrunkRegistrationModel(
            trunk=self.trunk,
            state=_STATES[status.state],
            registrar=status.registrar,
            aor=status.aor,
            contact=status.contact,
            expires_s=status.expires,
            expires_at=None if status.expires_at is None else round(status.expires_at + offset, 3),
            next_attempt_at=None if status.next_attempt_at is None else round(status.next_attempt_at + offset, 3),
            last_status=status.last_status,
            last_error=status.last_error[:1024],
            attempts=status.attempts,
        )

    def _on_registered(self, event: TrunkRegistered) -> None:
        worker_id = self._worker_id
        self._registered.set(1)
        if not event.contact_listed:
            self._outcomes["contact_missing"].inc()
            log.warning(
                "worker %s: trunk %s: %s answered %d to our REGISTER without listing our contact %s (other "
                "contacts: %d); calls for %s may not reach this worker",
                worker_id,
                self.trunk,
                event.registrar,
                event.status,
                event.contact,
                event.other_contacts,
                event.aor,
            )
        elif event.refreshed:
            self._outcomes["refreshed"].inc()
            log.debug("worker %s: trunk %s: registration refreshed for %d s", worker_id, self.trunk, event.expires)
        else:
            self._outcomes["registered"].inc()
            log.info(
                "worker %s: trunk %s: registered at %s for %s, %d s granted (other contacts: %d)",
                worker_id,
                self.trunk,
                event.registrar,
                event.aor,
                event.expires,
                event.other_contacts,
            )

    def _on_failed(self, event: TrunkRegistrationFailed) -> None:
        client = self.client
        self._registered.set(1 if client is not None and client.registered else 0)
        self._outcomes[event.outcome].inc()
        log.warning(
            "worker %s: trunk %s: registration failed (%d): %s; attempt %d failed, next in %.1f s",
            self._worker_id,
            self.trunk,
            event.status,
            event.reason,
            event.failures,
            event.retry_in,
        )

    def _on_unregistered(self, event: TrunkUnregistered) -> None:
        self._registered.set(0)
        self._ended.set()
        if event.ok:
            self._outcomes["unregistered"].inc()
            log.info("worker %s: trunk %s: trunk registration removed (%s)", self._worker_id, self.trunk, event.reason)
        else:
            self._outcomes["unregister_failed"].inc()
            log.warning(
                "worker %s: trunk %s: removing the trunk registration failed: %s",
                self._worker_id,
                self.trunk,
                event.reason,
            )


class TrunkRegistrations:
    """The worker's registrations, one per trunk with ``register = true`` (none: every call is a no-op). The
    first, ``default`` when there is one, is also the single ``registration`` of the heartbeat (older readers)."""

    def __init__(self, registrations: dict[str, TrunkRegistration]) -> None:
        self.by_trunk = dict(sorted(registrations.items(), key=lambda item: item[0] != DEFAULT_TRUNK))
        self._by_binding = {
            (r.config.registrar, r.config.aor): r for r in self.by_trunk.values() if r.config is not None
        }

    @property
    def primary(self) -> TrunkRegistration | None:
        return next(iter(self.by_trunk.values()), None)

    @property
    def client(self) -> RegistrationClient | None:
        primary = self.primary
        return primary.client if primary is not None else None

    def start(self) -> None:
        for registration in self.by_trunk.values():
            registration.start()

    def begin_unregister(self, reason: str) -> None:
        for registration in self.by_trunk.values():
            registration.begin_unregister(reason)

    async def unregister(self, reason: str) -> None:
        """Remove every binding at once and wait for them (each bounded by the unregister timeout)."""
        if self.by_trunk:
            await asyncio.gather(*(r.unregister(reason) for r in self.by_trunk.values()))

    def on_events(self, events: list[SipEvent]) -> None:
        routed: dict[str, list[SipEvent]] = {}
        for event in events:
            if isinstance(event, REGISTRATION_EVENTS):
                registration = self._by_binding.get((event.registrar, event.aor))
                if registration is not None:
                    routed.setdefault(registration.trunk, []).append(event)
        for trunk, mine in routed.items():
            self.by_trunk[trunk].on_events(mine)

    def info(self) -> TrunkRegistrationModel | None:
        primary = self.primary
        return primary.info() if primary is not None else None

    def infos(self) -> list[TrunkRegistrationModel]:
        return [info for r in self.by_trunk.values() if (info := r.info()) is not None]
