"""Shared machinery of the user-agent core: outbox, events, identifiers, transaction tables, addressing.

Owns: `Core`, the state every handler module (uas.py, uac.py) works on: the transaction tables keyed
per §17.1.3 / §17.2.3 with the merged-request index of §8.2.2.2, the calls (by handle and by dialog id),
the identifier factories (tags, branches with the z9hG4bK cookie, Call-IDs), our Via and Contact from
the advertised address, and the §18.2.2 rule for where a response goes (received / rport, or the
connection a request came on for reliable transports).

Target selection (§8.1.2, §18.1.1, RFC 3263 §4.1-4.2, RFC 5630): a request goes where its URI (the
Request-URI, or within a dialog the first Route or the remote target) points, over the transport it names
(``sips:`` or ``;transport=tls`` -> TLS, default port 5061), else over the call's own. Within a dialog on a
connection-oriented transport the request also names the connection the dialog came on (``flow``), which
the glue prefers while it is open when the next hop is the same host (RFC 5923's reuse, without the alias
parameter: the peer connected from an ephemeral port). A connection or TLS failure the glue reports fails
the client transactions toward that destination as if 503 had come (§8.1.3.1, §17.1.1.2, §17.1.2.2).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

from .call import Call, CallState
from .config import CONFIGURED_PROXY, DEFAULT_PORTS, ProxyChoice, SipConfig
from .dialog import Dialog, DialogId
from .errors import LocalProtocolError
from .events import Address, CallEnded, CallHandle, Outgoing, Side, SipEvent, SipStats
from .grammar import has_param
from .headers import BRANCH_MAGIC, Via
from .message import SipRequest, SipResponse, make_response
from .transaction import (
    ResponsePassed,
    Transaction,
    TransactionTimedOut,
    Transmit,
    TransportErrorReported,
    TxEffect,
    TxKind,
    TxState,
    client_key,
    server_key,
)
from .uri import SipUri, format_host, parse_uri

# Methods we implement (Allow), methods we know but refuse with 405, and our option tags (Supported).
ALLOWED_METHODS = ("INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "UPDATE", "REFER", "NOTIFY", "PRACK")
KNOWN_METHODS = frozenset({*ALLOWED_METHODS, "REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE"})
SUPPORTED_OPTIONS = ("timer", "norefersub")  # RFC 4028; RFC 4488 (refer_sub.py)
# As a UAS we also do 100rel (RFC 3262, prack.py); our own requests leave it out, so carriers keep sending
# unreliable 18x on our calls (a reliable one that comes anyway is PRACKed: prack.prack_reliable).
UAS_OPTIONS = ("100rel", *SUPPORTED_OPTIONS)

ResponseHandler = Callable[[Transaction, SipResponse | None, float], None]
TransportErrorHandler = Callable[[Transaction, TransportErrorReported, float], None]
MergeKey = tuple[str, str, int, str]  # From tag, Call-ID, CSeq number, method


def response_destination(via: Via, source: Address, transport: str) -> Address:
    """§18.2.2 with RFC 3581: reliable -> back on the connection; else received/rport, else sent-by."""
    if transport != "udp":
        return source
    host = via.received or via.sent_by[0]
    port = via.rport or via.port or 5060
    return host, port


class Core:
    def __init__(self, config: SipConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.stats = SipStats()
        self.outbox: list[Outgoing] = []
        self.pending_events: list[SipEvent] = []
        self.server_txs: dict[tuple[str, ...], Transaction] = {}
        self.client_txs: dict[tuple[str, ...], Transaction] = {}
        self.merge_index: dict[MergeKey, tuple[str, ...]] = {}
        # Transaction timers as a min-heap of (deadline, seq, tx), pushed whenever a transaction changes and
        # checked lazily: an entry counts only while its transaction is alive and still due then. A worker
        # keeps thousands of transactions alive (a 2xx'd INVITE waits 32 s in Accepted, §17.2.1 / RFC 6026),
        # and the transport asks for the next deadline after every message it feeds in.
        self._tx_timers: list[tuple[float, int, Transaction]] = []
        self._tx_seq = itertools.count()
        self.calls: dict[CallHandle, Call] = {}
        self.dialogs: dict[DialogId, CallHandle] = {}
        self.on_response: ResponseHandler = lambda tx, response, now: None
        self.on_transport_error: TransportErrorHandler = lambda tx, error, now: None
        # While False (a draining worker), out-of-dialog OPTIONS get 503: load balancers probing with
        # OPTIONS (Kamailio's dispatcher) stop sending new calls here, and calls in progress go on.
        self.accepting_calls = True
        self._counter = 0

    # --- identifiers -----------------------------------------------------------------------------

    def token(self, bits: int = 64) -> str:
        return f"{self.rng.getrandbits(bits):0{bits // 4}x}"

    def new_branch(self) -> str:
        return BRANCH_MAGIC + self.token(64)

    def new_handle(self) -> CallHandle:
        self._counter += 1
        return CallHandle(f"call-{self._counter}-{self.token(32)}")

    def via(self, transport: str, branch: str | None = None) -> str:
        host = format_host(self.config.via_host)
        port = self.config.port_for(transport)
        return f"SIP/2.0/{transport.upper()} {host}:{port};branch={branch or self.new_branch()};rport"

    def contact(self, transport: str, *, secure: bool = False) -> str:
        """Our Contact for messages over ``transport``; a sips URI in a secure dialog (§12.1.1, RFC 5630 §3.1.3:
        the dialog's Request-URI was sips), else ``;transport=`` naming a connection-oriented transport."""
        host = format_host(self.config.via_host)
        port = self.config.port_for(transport)
        if secure:
            return f"<sips:{self.config.contact_user}@{host}:{port}>"
        suffix = f";transport={transport}" if transport in ("tcp", "tls") else ""
        return f"<sip:{self.config.contact_user}@{host}:{port}{suffix}>"

    def common_headers(self, *, response: bool = False) -> tuple[tuple[str, str], ...]:
        """Allow, Supported and who we are: User-Agent on requests, Server on responses (RFC 3261 §20.35,
        §20.41), left out when the configured name is empty (not giving the product and version away)."""
        supported = UAS_OPTIONS if response else SUPPORTED_OPTIONS
        headers = (("Allow", ", ".join(ALLOWED_METHODS)), ("Supported", ", ".join(supported)))
        if self.config.user_agent:
            return (*headers, ("Server" if response else "User-Agent", self.config.user_agent))
        return headers

    def uri_destination(self, uri: SipUri) -> tuple[Address, str]:
        """Where an out-of-dialog request to ``uri`` goes and over what. A secure URI (sips, transport=tls)
        never falls back to a plain transport: without TLS configured it is refused."""
        transport = uri.transport
        if transport not in self.config.transports:
            if uri.secure:
                raise LocalProtocolError(f"{uri.scheme}:{uri.host} needs SIP over TLS, which is not enabled here")
            transport = self.config.transports[0]
        return uri.host_port(DEFAULT_PORTS[transport]), transport

    def out_of_dialog_hop(
        self, uri: SipUri, proxy_choice: ProxyChoice = CONFIGURED_PROXY
    ) -> tuple[Address, str, tuple[tuple[str, str], ...]]:
        """Where a request we start outside any dialog (an INVITE, a REGISTER) to ``uri`` goes, over what, and
        the Route it carries: with an outbound proxy configured, to the proxy, named in a Route with ``lr`` (RFC
        3261 §8.1.2: a preconfigured route set of one loose router; the Request-URI stays ``uri``); else to
        ``uri`` itself, with no Route. A secure URI is refused a plain proxy: sips means TLS on every hop.
        ``proxy_choice``: a trunk's own proxy (a URI, or None for none) instead of the configured one."""
        if proxy_choice is CONFIGURED_PROXY:
            proxy = self.config.outbound_proxy_uri
        else:
            proxy = parse_uri(proxy_choice) if proxy_choice is not None else None
        if proxy is None:
            destination, transport = self.uri_destination(uri)
            return destination, transport, ()
        if uri.secure and not proxy.secure:
            raise LocalProtocolError(
                f"{uri.scheme}:{uri.host} needs TLS on every hop and the outbound proxy {proxy} is not secure"
            )
        destination, transport = self.uri_destination(proxy)
        if not has_param(proxy.params, "lr"):
            proxy = proxy.with_params((*proxy.params, ("lr", None)))
        return destination, transport, (("Route", f"<{proxy}>"),)

    def next_hop(self, call: Call, dialog: Dialog | None = None) -> tuple[Address, str, Address | None]:
        """Destination, transport and preferred connection of a request within ``call``'s dialog (or
        ``dialog``, one the call is about to take or has refused)."""
        dialog = dialog or call.dialog
        assert dialog is not None
        uri = dialog.next_hop_uri()
        transport = uri.transport if uri.names_transport else call.transport
        if transport not in self.config.transports:
            transport = call.transport
        destination = uri.host_port(DEFAULT_PORTS.get(transport, 5060))
        flow = None
        if transport == call.transport and transport != "udp" and destination[0] == call.peer[0]:
            flow = call.peer
        return destination, transport, flow

    def send_in_dialog(self, call: Call, data: bytes, dialog: Dialog | None = None) -> None:
        """A message outside any transaction (the ACK of a 2xx) to the dialog's next hop."""
        destination, transport, flow = self.next_hop(call, dialog)
        self.send(data, destination, transport, flow=flow)

    # --- output ----------------------------------------------------------------------------------

    def send(self, data: bytes, destination: Address, transport: str, *, flow: Address | None = None) -> None:
        self.stats.datagrams_sent += 1
        self.outbox.append(Outgoing(data=data, destination=destination, transport=transport, flow=flow))

    def emit(self, event: SipEvent) -> None:
        self.pending_events.append(event)

    def reply_stateless(
        self,
        request: SipRequest,
        status: int,
        source: Address,
        transport: str,
        *,
        reason: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """A response outside any transaction (errors found before one exists, §8.2)."""
        response = make_response(request, status, reason, to_tag=self.token(32), headers=headers)
        self.send(response.encode(), response_destination(request.top_via, source, transport), transport)

    # --- transactions ----------------------------------------------------------------------------

    def start_client(
        self,
        request: SipRequest,
        destination: Address,
        transport: str,
        now: float,
        *,
        context: object = None,
        flow: Address | None = None,
    ) -> Transaction:
        kind = TxKind.INVITE_CLIENT if request.method == "INVITE" else TxKind.NON_INVITE_CLIENT
        tx, effects = Transaction.start(
            kind,
            request,
            peer=destination,
            transport=transport,
            timers=self.config.timers,
            now=now,
            context=context,
            flow=flow,
        )
        self.client_txs[client_key(request.top_via.branch or "", request.method)] = tx
        self.apply(tx, effects, now)
        return tx

    def start_server(self, request: SipRequest, source: Address, transport: str, now: float) -> Transaction:
        kind = TxKind.INVITE_SERVER if request.method == "INVITE" else TxKind.NON_INVITE_SERVER
        peer = response_destination(request.top_via, source, transport)
        tx, effects = Transaction.start(
            kind, request, peer=peer, transport=transport, timers=self.config.timers, now=now
        )
        key = server_key(request)
        self.server_txs[key] = tx
        if request.to.tag is None:
            self.merge_index[merge_key(request)] = key
        self.apply(tx, effects, now)
        return tx

    def respond(
        self,
        tx: Transaction,
        status: int,
        now: float,
        *,
        reason: str | None = None,
        to_tag: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
    ) -> SipResponse:
        response = make_response(tx.request, status, reason, to_tag=to_tag, headers=headers, body=body)
        self.apply(tx, tx.respond(response, now), now)
        return response

    def apply(self, tx: Transaction, effects: list[TxEffect], now: float) -> None:
        for effect in effects:
            if isinstance(effect, Transmit):
                self.send(effect.data, tx.peer, tx.transport, flow=tx.flow)
            elif isinstance(effect, ResponsePassed):
                self.on_response(tx, effect.response, now)
            elif isinstance(effect, TransactionTimedOut):
                self.on_response(tx, None, now)
            elif isinstance(effect, TransportErrorReported):
                self.on_transport_error(tx, effect, now)
        if tx.state is TxState.TERMINATED:
            self._forget(tx)
            return
        deadline = tx.next_deadline()
        if deadline is not None:
            heapq.heappush(self._tx_timers, (deadline, next(self._tx_seq), tx))

    def _forget(self, tx: Transaction) -> None:
        # A call and its INVITE transaction point at each other (``Call.invite_tx``, ``Transaction.context``):
        # dropping the ended transaction's side lets reference counting free both, not a full GC pass.
        tx.context = None
        request = tx.request
        if tx.kind in (TxKind.INVITE_SERVER, TxKind.NON_INVITE_SERVER):
            key = server_key(request)
            if self.server_txs.get(key) is tx:
                del self.server_txs[key]
            mkey = merge_key(request)
            if self.merge_index.get(mkey) == key:
                del self.merge_index[mkey]
        else:
            ckey = client_key(request.top_via.branch or "", request.method)
            if self.client_txs.get(ckey) is tx:
                del self.client_txs[ckey]

    def transport_failed(self, destination: Address, transport: str, now: float, *, cause: str, detail: str) -> int:
        """The glue could not deliver to ``destination`` over ``transport`` (no connection, a failed TLS
        handshake, ...): every client transaction toward it ends as if 503 had come. Returns how many."""
        failed = [
            tx
            for tx in self.client_txs.values()
            if tx.peer == destination and tx.transport == transport and tx.state is not TxState.TERMINATED
        ]
        for tx in failed:
            self.apply(tx, tx.transport_error(now, cause=cause, detail=detail), now)
        return len(failed)

    def flow_in_use(self, transport: str, address: Address) -> bool:
        """True while a live call's dialog came on, or was placed over, this connection."""
        return any(call.transport == transport and call.peer == address for call in self.calls.values())

    def fire_transaction_timers(self, now: float) -> None:
        timers = self._tx_timers
        due: dict[int, Transaction] = {}
        while timers and timers[0][0] <= now:
            deadline, _, tx = heapq.heappop(timers)
            if tx.state is not TxState.TERMINATED and tx.next_deadline() == deadline:
                due[id(tx)] = tx
        for tx in due.values():
            before = tx.state
            effects = tx.fire_due(now)
            if tx.state is before and any(isinstance(e, Transmit) for e in effects):
                self.stats.retransmissions_sent += 1
            self.apply(tx, effects, now)

    def _next_transaction_deadline(self) -> float | None:
        timers = self._tx_timers
        while timers:
            deadline, _, tx = timers[0]
            if tx.state is not TxState.TERMINATED and tx.next_deadline() == deadline:
                return deadline
            heapq.heappop(timers)  # stale: the transaction moved on or ended since this entry
        return None

    # --- calls -----------------------------------------------------------------------------------

    def add_call(self, call: Call) -> None:
        self.calls[call.handle] = call

    def bind_dialog(self, call: Call) -> None:
        if call.dialog is not None:
            self.dialogs[call.dialog.id] = call.handle

    def call_for_dialog(self, dialog_id: DialogId) -> Call | None:
        handle = self.dialogs.get(dialog_id)
        return self.calls.get(handle) if handle is not None else None

    def end_call(self, call: Call, *, reason: str, by: Side, status: int | None = None) -> None:
        """Report the end once (CallEnded is the last event of every call) and forget the call, unless a
        BYE still waits for the ACK of our 2xx (§15); in-flight transactions finish on their own."""
        if not call.end_reported:
            call.end_reported = True
            self.emit(CallEnded(call=call.handle, reason=reason, by=by, status=status))
        if call.bye_pending is not None and call.state is CallState.ANSWERED:
            return
        call.state = CallState.ENDED
        call.ok_next = call.ok_give_up = None
        call.session_timer = None
        self.forget_call(call)

    def forget_call(self, call: Call) -> None:
        self.calls.pop(call.handle, None)
        if call.dialog is not None and self.dialogs.get(call.dialog.id) == call.handle:
            del self.dialogs[call.dialog.id]

    def next_deadline(self) -> float | None:
        first = self._next_transaction_deadline()
        deadlines = [first] if first is not None else []
        for call in self.calls.values():
            deadlines.extend(call.deadlines())
        return min(deadlines) if deadlines else None


def merge_key(request: SipRequest) -> MergeKey:
    return (request.from_.tag or "", request.call_id, request.cseq.number, request.method)
