"""Dialog state (RFC 3261 §12): identifiers, CSeq spaces, route set and remote target.

Owns: `Dialog`, created on the UAS side from an INVITE (§12.1.1) or on the UAC side from a 2xx (§12.1.2);
`build_request` for requests within the dialog (§12.2.1.1, loose and strict routing) and `next_hop`,
the address those requests go to (first Route if there is a route set, else the remote target: §8.1.2).
Target refresh (§12.2: re-INVITE/UPDATE Contact) and the remote CSeq check (§12.2.2: lower -> 500) too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import RemoteProtocolError
from .grammar import has_param
from .message import SipRequest, SipResponse, is_rfc3261
from .uri import NameAddr, SipUri, parse_name_addr

DialogId = tuple[str, str, str]  # Call-ID, local tag, remote tag


@dataclass(kw_only=True)
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: NameAddr  # without tag
    remote_uri: NameAddr  # without tag
    remote_target: SipUri
    route_set: list[NameAddr] = field(default_factory=list)
    local_seq: int = 0
    remote_seq: int | None = None
    transport: str = "udp"

    @property
    def id(self) -> DialogId:
        return (self.call_id, self.local_tag, self.remote_tag)

    @classmethod
    def for_uas(cls, request: SipRequest, local_tag: str, *, transport: str) -> Dialog:
        """§12.1.1: route set = Record-Route in order, remote target = the request's Contact (an RFC 2543
        request without one: its From URI, where RFC 2543 sent later requests)."""
        contacts = request.contacts
        remote = request.from_
        if not contacts and is_rfc3261(request):
            raise RemoteProtocolError("INVITE without Contact")
        return cls(
            call_id=request.call_id,
            local_tag=local_tag,
            remote_tag=remote.tag or "",
            local_uri=request.to.with_params(()),
            remote_uri=remote.with_params(()),
            remote_target=contacts[0].uri if contacts else remote.uri,
            route_set=[parse_name_addr(value) for value in request.headers.values("Record-Route")],
            local_seq=0,
            remote_seq=request.cseq.number,
            transport=transport,
        )

    @classmethod
    def for_uac(cls, request: SipRequest, response: SipResponse, *, transport: str) -> Dialog:
        """§12.1.2: route set = Record-Route reversed, remote target = the response's Contact."""
        contacts = response.contacts
        if not contacts:
            raise RemoteProtocolError("2xx without Contact")
        local = request.from_
        return cls(
            call_id=request.call_id,
            local_tag=local.tag or "",
            remote_tag=response.to.tag or "",
            local_uri=local.with_params(()),
            remote_uri=response.to.with_params(()),
            remote_target=contacts[0].uri,
            route_set=[parse_name_addr(value) for value in reversed(response.headers.values("Record-Route"))],
            local_seq=request.cseq.number,
            remote_seq=None,
            transport=transport,
        )

    def accept_remote_cseq(self, number: int, method: str) -> bool:
        """§12.2.2: a CSeq lower than the last one is out of order (500); ACK/CANCEL reuse theirs."""
        if method in ("ACK", "CANCEL"):
            return True
        if self.remote_seq is not None and number <= self.remote_seq:
            return False
        self.remote_seq = number
        return True

    def refresh_target(self, message: SipRequest | SipResponse) -> None:
        """Target refresh (re-INVITE, UPDATE and their 2xx): a new Contact replaces the remote target."""
        try:
            contacts = message.contacts
        except RemoteProtocolError:
            return
        if contacts:
            self.remote_target = contacts[0].uri

    def next_hop_uri(self) -> SipUri:
        return self.route_set[0].uri if self.route_set else self.remote_target

    def build_request(self, method: str, *, via: str, cseq: int | None = None) -> SipRequest:
        """A request in this dialog; CSeq is the next local one unless given (ACK and CANCEL reuse)."""
        if cseq is None:
            self.local_seq += 1
            cseq = self.local_seq
        routes = [str(route) for route in self.route_set]
        uri = self.remote_target
        if self.route_set and not has_param(self.route_set[0].uri.params, "lr"):  # ";lr" is a flag: no value
            # §12.2.1.1 strict routing: the first route becomes the Request-URI, the target goes last.
            uri = self.route_set[0].uri.with_params(
                tuple(p for p in self.route_set[0].uri.params if p[0] not in ("method", "maddr", "ttl", "transport"))
            )
            routes = [*routes[1:], f"<{self.remote_target}>"]
        request = SipRequest(method=method, uri=uri)
        request.headers.add("Via", via)
        for route in routes:
            request.headers.add("Route", route)
        request.headers.add("Max-Forwards", "70")
        request.headers.add("From", f"{self.local_uri};tag={self.local_tag}")
        # An RFC 2543 peer may have sent no From tag: its To then carries none either (§12.2.1.1).
        request.headers.add(
            "To", f"{self.remote_uri};tag={self.remote_tag}" if self.remote_tag else str(self.remote_uri)
        )
        request.headers.add("Call-ID", self.call_id)
        request.headers.add("CSeq", f"{cseq} {method}")
        return request
