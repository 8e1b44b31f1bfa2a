"""The synthetic callers' signalling (RFC 3261 UAC), sans-I/O on top of :class:`~gateway.sip.endpoint.SipEndpoint`.

:class:`LoadCalls` places each call with an offer of exactly one codec (plus telephone-event), follows it
through the endpoint's events and ends it: our BYE after the planned duration, a CANCEL when no final answer
came within the setup timeout, or the far end's BYE. It measures setup time as INVITE sent -> 2xx received
(the event that reports the 2xx is drained in the same pump as the response, so the time read at the event
is the arrival time to within the pump's own work).

It owns no socket, timer or clock: the glue (:mod:`gateway.loadtest.runner`) passes ``now``, sends what the
endpoint queued, arms timers at :meth:`LoadCalls.next_deadline`, and starts or stops RTP through the two
hooks ``on_answered`` and ``on_ended``.
"""

from __future__ import annotations

import heapq
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import CallEnded, CallHandle, OutboundCallAnswered, OutboundCallFailed, SipEvent
from gateway.sip.offer_answer import MediaPolicy, OfferAnswer, Refused
from gateway.sip.sdes import SrtpNegotiated
from gateway.sip.sdp import NegotiatedMedia

CallPhase = Literal["inviting", "up", "ending", "done"]
Outcome = Literal["completed", "failed", "timeout", "dropped", "bad_answer", "interrupted", "pending"]


@dataclass(slots=True)
class LoadCall:
    """One synthetic call, mutable while it runs (the glue hangs its media off ``media``)."""

    index: int
    handle: CallHandle
    rtp_host: str
    rtp_port: int
    invited_at: float
    phase: CallPhase = "inviting"
    answered_at: float | None = None
    ended_at: float | None = None
    hangup_at: float | None = None
    status: int | None = None  # final SIP status of the INVITE (200 when answered)
    outcome: Outcome = "pending"
    reason: str = ""
    ended_by: str = ""
    sdp: OfferAnswer | None = field(default=None, repr=False)  # our offer, then what its answer agreed
    media: object = field(default=None, repr=False)

    @property
    def setup_s(self) -> float | None:
        return None if self.answered_at is None else self.answered_at - self.invited_at

    @property
    def negotiated(self) -> NegotiatedMedia | None:
        return self.sdp.media if self.sdp is not None else None

    @property
    def srtp(self) -> SrtpNegotiated | None:
        """The SDES keys, when the call is SRTP."""
        return self.sdp.srtp if self.sdp is not None else None


class LoadCalls:
    """Every synthetic call of one process. See the module docstring for who drives it."""

    def __init__(
        self,
        endpoint: SipEndpoint,
        *,
        target: tuple[str, int],
        transport: str,
        codec: str,
        duration_s: float,
        setup_timeout_s: float,
        on_answered: Callable[[LoadCall, float], None],
        on_ended: Callable[[LoadCall, float], None],
        request_user: str = "agent",
        rng: random.Random | None = None,
        srtp: str | None = None,
        key_source: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.endpoint = endpoint
        self.target = target
        self.transport = transport
        self.codec = codec
        self.duration_s = duration_s
        self.setup_timeout_s = setup_timeout_s
        self.request_user = request_user
        self.srtp = srtp  # SDES suite each call offers (RTP/SAVP); None: plain RTP
        self._key_source = key_source
        # one codec (plus telephone-event) and, with SRTP, one a=crypto line of that suite on RTP/SAVP
        self._policy = (
            MediaPolicy(codecs=(codec,), srtp="off")
            if srtp is None
            else MediaPolicy(codecs=(codec,), srtp="required", suites=(srtp,))
        )
        self._on_answered = on_answered
        self._on_ended = on_ended
        self._rng = rng or random.Random()
        self.calls: dict[CallHandle, LoadCall] = {}
        self.finished: list[LoadCall] = []
        self._timers: list[tuple[float, int, CallHandle]] = []  # (when, kind 0=setup timeout 1=hang-up, call)

    @property
    def active(self) -> int:
        return len(self.calls)

    @property
    def up(self) -> int:
        return sum(1 for c in self.calls.values() if c.phase == "up")

    def request_uri(self) -> str:
        host, port = self.target
        host = f"[{host}]" if ":" in host else host
        suffix = f";transport={self.transport}" if self.transport in ("tcp", "tls") else ""
        return f"sip:{self.request_user}@{host}:{port}{suffix}"

    def place(self, index: int, *, rtp_host: str, rtp_port: int, now: float) -> LoadCall:
        """Send the INVITE of call ``index`` whose RTP is received on ``rtp_host:rtp_port``."""
        sdp = OfferAnswer(
            self._policy,
            session_id=self._rng.getrandbits(31),
            key_source=self._key_source,
            address=rtp_host,
            port=rtp_port,
        )
        offer = sdp.offer()
        handle = self.endpoint.invite(
            self.request_uri(),
            now,
            from_uri=f"sip:load{index}@{self.endpoint.config.via_host}",
            body=offer.to_bytes(),
        )
        call = LoadCall(index=index, handle=handle, rtp_host=rtp_host, rtp_port=rtp_port, invited_at=now)
        call.sdp = sdp
        self.calls[handle] = call
        heapq.heappush(self._timers, (now + self.setup_timeout_s, 0, handle))
        return call

    def on_events(self, events: list[SipEvent], now: float) -> None:
        for event in events:
            call = self.calls.get(event.call) if hasattr(event, "call") else None  # type: ignore[arg-type]
            if call is None:
                continue
            if isinstance(event, OutboundCallAnswered):
                self._answered(call, event, now)
            elif isinstance(event, OutboundCallFailed):
                call.status = event.status
                if call.outcome == "pending":
                    call.outcome = "timeout" if event.status == 408 else "failed"
                call.reason = event.reason
                self._end(call, now, by="remote")
            elif isinstance(event, CallEnded):
                if call.outcome == "pending":
                    # The far end hung up before our planned BYE: the call was cut short.
                    call.outcome = "dropped" if call.answered_at is not None else "failed"
                    call.reason = event.reason
                if event.status is not None and call.status is None:
                    call.status = event.status
                self._end(call, now, by=event.by)

    def _answered(self, call: LoadCall, event: OutboundCallAnswered, now: float) -> None:
        call.status = 200
        call.answered_at = now
        assert call.sdp is not None
        result = call.sdp.take_answer(event.body)
        if isinstance(result, Refused):
            call.outcome = "bad_answer"
            call.reason = result.reason
            self.hang_up(call, now)
            return
        call.phase = "up"
        call.hangup_at = now + self.duration_s
        heapq.heappush(self._timers, (call.hangup_at, 1, call.handle))
        self._on_answered(call, now)

    def hang_up(self, call: LoadCall, now: float, *, outcome: Outcome | None = None) -> None:
        """End the call from our side (BYE, or CANCEL while it rings). Idempotent."""
        if call.phase in ("ending", "done"):
            return
        if outcome is not None and call.outcome == "pending":
            call.outcome = outcome
        call.phase = "ending"
        self.endpoint.hang_up(call.handle, now, reason="load test done")
        # hang_up emits CallEnded(by="local") at once; the glue's pump delivers it to on_events.

    def hang_up_all(self, now: float, *, outcome: Outcome = "completed") -> None:
        for call in list(self.calls.values()):
            unanswered = call.answered_at is None and outcome != "interrupted"
            self.hang_up(call, now, outcome="timeout" if unanswered else outcome)

    def _end(self, call: LoadCall, now: float, *, by: str) -> None:
        if call.phase == "done":
            return
        call.phase = "done"
        call.ended_at = now
        call.ended_by = by
        if call.outcome == "pending":
            call.outcome = "completed" if call.answered_at is not None else "failed"
        self.calls.pop(call.handle, None)
        self.finished.append(call)
        self._on_ended(call, now)

    def next_deadline(self) -> float | None:
        while self._timers:
            when, kind, handle = self._timers[0]
            call = self.calls.get(handle)
            if call is None or (kind == 0 and call.answered_at is not None) or call.phase in ("ending", "done"):
                heapq.heappop(self._timers)
                continue
            return when
        return None

    def handle_timers(self, now: float) -> None:
        """Hang up calls whose duration is over, CANCEL those that rang too long."""
        while self._timers and self._timers[0][0] <= now:
            _, kind, handle = heapq.heappop(self._timers)
            call = self.calls.get(handle)
            if call is None or call.phase in ("ending", "done"):
                continue
            if kind == 0 and call.answered_at is None:
                self.hang_up(call, now, outcome="timeout")
            elif kind == 1:
                self.hang_up(call, now, outcome="completed")
