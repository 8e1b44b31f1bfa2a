"""Early media of a worker's SIP calls: audio before the 200 OK, both ways (docs/operations.md, "Early media").

Inbound (the route's ``early_media``, carried by the admission decision): the worker answers the INVITE's offer in a
183 Session Progress (the same SDP, byte for byte, as the later 200 OK: gateway/sip/early_media.py), and before the
200 plays

* ``tone``: a ringback tone (425 Hz, 1 s on / 4 s off, ITU-T E.180) or ``early_media_file``, for ``early_media_s``;
* ``greeting``: the agent's greeting. The session starts (connects, asks for the greeting) before the 200; the call
  is answered once the greeting has played out (``GREETING_DONE_S`` of silence after its audio), at
  ``early_media_s`` at the latest.

Early media is one-way (RFC 3960 §2): phones send nothing before the 200, and what a caller does send (comfort
noise, an early "hello") is counted and recorded but never reaches the agent, so it cannot barge into the greeting.

Outbound (originate): the first 18x with SDP (its fork's, gateway/sip/early_media.py ``EarlyDialogs``) starts the
media at once: the callee's ringback or the carrier's announcement is received, counted and recorded, and the
session is made (not started: no provider connection, no greeting) so its recording holds it. Nothing of it reaches
the agent or answering-machine detection: AMD's input and clock start at the 200 OK, because a ringback tone is the
steady pure tone AMD takes for a voicemail beep, and a carrier's announcement is not the callee. We send silence
(the media tick's packets, which keep a NAT binding open) during it. On the 200 the media follows the 2xx's SDP
if it differs (another fork, or a changed answer).

The tick's side is :class:`EarlyMedia` (``TickRoute.early``, read by gateway/worker/worker.py): while a call has
one, the caller's frames stop there, and the frames sent are its own (tone) or the session's (greeting).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.fleet.models import EarlyMediaModel
from gateway.media.early import EarlyMedia, ringback_frames
from gateway.observability import EARLY_MEDIA_CALLS_TOTAL, EARLY_MEDIA_FRAMES_TOTAL
from gateway.sip.early_media import EarlyDialogs
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import OutboundCallAnswered, OutboundCallProgressed
from gateway.sip.offer_answer import Answered, OfferAnswerState, Refused
from telcodecs.frames import Frame

if TYPE_CHECKING:
    from gateway.worker.routes import TickRoute
    from gateway.worker.sip_leg import CallLeg

log = logging.getLogger(__name__)


def _count(early: EarlyMedia, worker: str) -> None:
    EARLY_MEDIA_FRAMES_TOTAL.labels(worker, "received").inc(early.heard)
    EARLY_MEDIA_FRAMES_TOTAL.labels(worker, "sent").inc(early.sent)


async def play_inbound(
    leg: CallLeg,
    plan: EarlyMediaModel,
    *,
    route: TickRoute | None,
    worker: str,
    ring: Callable[[bytes], None],
    start_session: Callable[[], Awaitable[None]],
    end: Callable[[str], None],
    load_file: Callable[[str], tuple[Frame, ...]],
) -> bool:
    """183 with the answer, then the plan's early media; False when the call ended meanwhile (or could not go on).
    ``ring(body)`` sends the 183; ``start_session()`` is the session's start (awaitable) for a greeting."""
    sdp, session = leg.sdp, leg.session
    if sdp is None or sdp.local is None or sdp.state is not OfferAnswerState.NEGOTIATED or session is None:
        log.info("call %s: no early media for an INVITE without an offer (RFC 3261 §13.2.1)", leg.id)
        return True
    if route is None:
        return True
    if plan.mode == "greeting" and not session.profile.greeting:
        log.info("call %s: early media greeting, but the profile has no greeting: answered at once", leg.id)
        return True
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    if plan.mode == "tone":
        frames = ringback_frames()
        if plan.file:
            try:
                frames = load_file(plan.file) or frames
            except Exception as exc:  # a file that cannot be read: the tone instead, the call goes on
                log.warning(
                    "call %s: early media file %s unreadable (%s): the ringback tone instead", leg.id, plan.file, exc
                )
        early = EarlyMedia(frames)
    else:
        early = EarlyMedia(on_done=done.set)
    leg.early = early
    try:
        ring(sdp.local.to_bytes())
    except LocalProtocolError:  # cancelled meanwhile
        leg.early = None
        return False
    EARLY_MEDIA_CALLS_TOTAL.labels(worker, "inbound", plan.mode).inc()
    route.early = early
    started = loop.time()
    ended: asyncio.Task[object] = asyncio.ensure_future(session.wait_ended())
    waiters: set[asyncio.Task[object]] = {ended}
    if plan.mode == "greeting":
        waiters.add(asyncio.ensure_future(done.wait()))
    try:
        if plan.mode == "greeting" and not await _started(leg, start_session, end):
            return False
        remaining = max(plan.seconds - (loop.time() - started), 0.0)
        finished, _ = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        return ended not in finished
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)  # owned here: awaited after the cancel
        route.early = None
        leg.early = None
        leg.early_heard, leg.early_sent = early.heard, early.sent
        _count(early, worker)
        log.info(
            "call %s: early media %s for %.2f s: %d frames sent, %d received (not passed on)",
            leg.id,
            plan.mode,
            loop.time() - started,
            early.sent,
            early.heard,
        )


async def _started(leg: CallLeg, start_session: Callable[[], Awaitable[None]], end: Callable[[str], None]) -> bool:
    """The session's start for a greeting in early media; a failure ends the call (a 480 to the caller)."""
    failure: Exception | None = None
    try:
        await start_session()
    except Exception as exc:  # the call ends here, as when the session fails to start after the 200
        failure = exc
    if failure is None:
        return True
    log.warning("call %s: session failed to start for the early greeting: %s", leg.id, failure)
    end(leg.end_reason or "provider_unavailable")
    return False


def outbound_progressed(
    leg: CallLeg, event: OutboundCallProgressed, *, worker: str, start_media: Callable[[], TickRoute | None]
) -> bool:
    """An 18x on our INVITE: True when its SDP started the call's media (the caller then makes the session)."""
    dialogs = leg.early_dialogs
    if dialogs is None:
        dialogs = leg.early_dialogs = EarlyDialogs()
    action = dialogs.progressed(body=event.body, content_type=event.content_type, to_tag=event.to_tag)
    if action != "start" or leg.sdp is None or leg.sdp.state is not OfferAnswerState.OFFERED:
        return False
    result = leg.sdp.take_answer(event.body, early=True)
    if isinstance(result, Refused):
        log.info("call %s: the %d's SDP is unusable (%s): no early media", leg.id, event.status, result.reason)
        dialogs.to_tag = None
        return False
    leg.early = EarlyMedia()
    route = start_media()
    if route is not None:
        route.early = leg.early
    EARLY_MEDIA_CALLS_TOTAL.labels(worker, "outbound", "received").inc()
    log.info("call %s: early media from the %d (fork %s)", leg.id, event.status, event.to_tag)
    return True


def outbound_answered(
    leg: CallLeg,
    event: OutboundCallAnswered,
    *,
    route: TickRoute | None,
    worker: str,
    follow: Callable[[Answered], None],
) -> bool | None:
    """The 2xx after early media: None when there was none (the caller takes the answer as usual); else True when
    the media goes on (kept, or moved to the 2xx's SDP by ``follow``), False when the 2xx's SDP cannot be used."""
    dialogs, early, sdp = leg.early_dialogs, leg.early, leg.sdp
    if dialogs is None or not dialogs.started or sdp is None or sdp.state is not OfferAnswerState.EARLY:
        return None
    if early is not None:
        leg.early_heard, leg.early_sent = early.heard, early.sent
        _count(early, worker)
        log.info("call %s: answered after %d frames of early media", leg.id, early.heard)
    if route is not None:
        route.early = None
    leg.early = None
    if dialogs.answered(body=event.body, to_tag=event.to_tag) == "keep":
        sdp.confirm_early()
        return True
    before, before_srtp = sdp.media, sdp.srtp
    result = sdp.take_answer(event.body)
    if isinstance(result, Refused):
        log.info("call %s: unusable SDP in the 2xx: %s", leg.id, result.reason)
        return False
    media = result.media
    if before is not None and (media.codec_name, media.payload_type) != (before.codec_name, before.payload_type):
        log.info("call %s: the answering fork changed the codec from the early media's: not supported", leg.id)
        return False
    if (before_srtp is None) != (result.srtp is None):
        log.info("call %s: the answering fork and the early media differ in SRTP: not supported", leg.id)
        return False
    if result.changed:
        follow(result)  # its address, and its keys when they differ (RFC 4568 §7.1.4)
        log.info("call %s: the 2xx moved the media to %s:%d (fork %s)", leg.id, *media.remote_rtp, event.to_tag)
    return True
