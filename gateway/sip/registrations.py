"""The endpoint's registration clients, run on its core (RFC 3261 §10.2 over §17.1.2 transactions).

Owns: `Registrations`. Each client's REGISTERs get our Via and go out in non-INVITE client transactions
(retransmitted until answered, Timer F for silence) to the registrar URI's address, or to the outbound
proxy when one is configured; the responses and timeouts of those transactions come back here through the
endpoint, the clients' timers are part of the endpoint's `next_deadline()`, and their events join the core's
(`SipEndpoint.events()`). The state machine itself is registration.py's.
"""

from __future__ import annotations

from .core import Core
from .events import Address
from .message import SipResponse
from .registration import RegistrationClient, RegistrationConfig, RegState
from .transaction import Transaction


class Registrations:
    """The registration clients of one endpoint (normally one: the trunk's)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.clients: list[RegistrationClient] = []
        self._routes: dict[int, tuple[Address, str]] = {}

    def add(self, config: RegistrationConfig, now: float) -> RegistrationClient:
        """Start keeping `config`'s binding; the first REGISTER goes out at once."""
        core = self._core
        destination, transport, route = core.out_of_dialog_hop(config.registrar_uri, config.outbound_proxy)
        client = RegistrationClient(
            config,
            contact=core.contact(transport),
            call_id_host=core.config.via_host,
            rng=core.rng,
            headers=(*route, *core.common_headers()),
            transaction_timeout_s=core.config.timers.f,
        )
        self.clients.append(client)
        self._routes[id(client)] = (destination, transport)
        client.start(now)
        self._flush(client, now)
        return client

    def stop(self, client: RegistrationClient, now: float, *, within: float) -> None:
        """Remove `client`'s binding, giving up `within` seconds from now (see `RegistrationClient.stop`)."""
        client.stop(now, within=within)
        if client in self.clients:
            self._flush(client, now)

    def on_response(self, tx: Transaction, response: SipResponse | None, now: float) -> bool:
        """Deliver a client transaction's response; False when the transaction is not a registration's."""
        client = tx.context
        if not isinstance(client, RegistrationClient):
            return False
        client.on_response(tx.request, response, now)
        if client in self.clients:
            self._flush(client, now)
        return True

    def fire_timers(self, now: float) -> None:
        for client in list(self.clients):
            client.handle_timer(now)
            self._flush(client, now)

    def next_deadline(self) -> float | None:
        deadlines = [d for client in self.clients if (d := client.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def _flush(self, client: RegistrationClient, now: float) -> None:
        core = self._core
        destination, transport = self._routes[id(client)]
        requests, client.outbox = client.outbox, []
        for request in requests:
            request.headers.prepend("Via", core.via(transport))
            core.start_client(request, destination, transport, now, context=client)
        events, client.events = client.events, []
        for event in events:
            core.emit(event)
        if client.state is RegState.STOPPED:
            self.clients.remove(client)
            del self._routes[id(client)]
