"""The ``websocket`` provider: a bot speaking the media-stream protocol (:mod:`.protocol`) behind the session contract.

Connect: open the bot's URL (headers and token from settings; no Origin header), send ``connected`` and
``start``, then hand the socket to a :class:`~gateway.providers._link.ProviderLink` whose receive task feeds the
bot's messages through the protocol core. Caller audio goes out as one ``media`` message per 20 ms, written from
the media tick when the socket takes it at once.

What the bot sends becomes the session's ordinary events: ``media`` -> ResponseStarted (first audio of an
utterance) and AudioReceived; ``mark`` -> the utterance ends (AudioDone, ResponseDone) and an
:class:`~gateway.providers.base.AudioMarked` whose ``reached`` callback answers the mark once the session's
playout has sent the audio before it; ``clear`` -> ResponseInterrupted, so the session cuts its playout in the
tick (a barge-in) and answers the pending marks at once, as Twilio does. Playout paces the bot: it may send
faster than real time, up to ``max_queued_s`` ahead (:mod:`.ledger`); beyond that its audio is refused and counted.

Ending: our hang-up sends ``stop`` and closes with 1000. The bot closing with 1000 is its hang-up: the call's
built-in ``hang_up`` tool is requested, so what it queued plays out first (bounded by the session's
``hangup_drain_timeout_s``), and the call ends as ``agent_hang_up``. Any other close ends the connection with
ProviderDisconnected, retryable for the codes a new connection may cure (1001, 1006, 1011-1014), and the
session's resume opens a fresh stream (new streamSid, same callSid). Garbage from the bot is counted, logged
(the first of each kind at warning level) and reported as a non-fatal ProviderErrored; the call goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gateway.providers._link import ProviderLink, open_websocket
from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioMarked,
    AudioReceived,
    BotSpec,
    Capabilities,
    HistoryItem,
    ProviderDisconnected,
    ProviderErrored,
    ProviderEvent,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SessionStarted,
    ToolCallRequested,
)
from gateway.providers.errors import ProviderClosedError, ProviderConfigError, ProviderConnectError, ProviderError
from gateway.providers.media_stream.audio import AudioBridge
from gateway.providers.media_stream.ledger import PlayoutLedger
from gateway.providers.media_stream.protocol import (
    BotAudioReceived,
    BotCleared,
    BotEvent,
    BotMarked,
    BotMessageRejected,
    MediaFormat,
    StreamIdentity,
    StreamProtocol,
    WireAudio,
    twilio_sid,
)

log = logging.getLogger(__name__)

# Close codes after which a new stream may continue the call: going away (a bot restarting), abnormal drop
# (no close frame), server error, service restart, try again later, bad gateway. 1000 is the bot's hang-up.
RETRYABLE_CLOSE_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})
BOT_HANG_UP_TOOL = "hang_up"


def redact_url(url: str) -> str:
    """``scheme://host:port/…``: the path and query may carry a token (Pipecat's ``/ws/<token>``)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    tail = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{host}{port}{tail}"


def twilio_signature(url: str, auth_token: str) -> str:
    """``X-Twilio-Signature`` of a websocket upgrade: base64 HMAC-SHA1 of the URL keyed by the auth token."""
    digest = hmac.new(auth_token.encode(), url.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True, slots=True, kw_only=True)
class BotConfig:
    """The worker's bot settings (``GATEWAY_BOT_*``); a profile's :class:`BotSpec` overrides url and audio."""

    url: str = ""
    audio: WireAudio = "mulaw"
    token: str = field(default="", repr=False)  # sent as "Authorization: Bearer <token>"
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    twilio_auth_token: str = field(default="", repr=False)  # signs the upgrade with X-Twilio-Signature
    account_sid: str = "AC" + "0" * 32
    open_timeout_s: float = 5.0
    max_queued_s: float = 60.0
    event_queue_size: int = 512


class BotSession:
    """One stream to the bot for one call. See :class:`gateway.providers.base.RealtimeSession`."""

    def __init__(self, *, protocol: StreamProtocol, bridge: AudioBridge, ledger: PlayoutLedger, name: str) -> None:
        self.protocol = protocol
        self.bridge = bridge
        self.ledger = ledger
        self.name = name
        self.session_id = protocol.identity.stream_sid
        self._link: ProviderLink | None = None
        self._ids = itertools.count(1)
        self._response_id = ""
        self._item_id = ""
        self._outbox: deque[str] = deque()  # mark names to answer, in order, when the tick could not write them
        self._outbox_wake = asyncio.Event()
        self._writer_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._closing = False
        self.hung_up_by_bot = False
        self._overflowing = False
        self._warned: set[str] = set()
        self.audio_dropped = 0  # caller audio sends dropped because the stream had closed

    def attach(self, link: ProviderLink) -> None:
        self._link = link
        self._writer_task = asyncio.create_task(self._writer(), name=f"{self.name}-marks")

    # ------------------------------------------------------------------------------------- to the bot

    # A send that finds the socket closed drops its message instead of raising: the receive task is about to
    # report the close with the bot's code (a hang-up or a drop), and that, not the send, decides what happens.

    def send_audio_nowait(self, pcm: bytes) -> bool:
        link = self._require_link()
        try:
            if self.hung_up_by_bot or not link.is_open:
                self.audio_dropped += 1
                return True
            if self._outbox or not link.writable():  # marks wait: keep the wire in sequence order
                return False
            protocol = self.protocol
            return link.send_texts_nowait([protocol.media(chunk) for chunk in self.bridge.to_wire(pcm)])
        except ProviderClosedError:
            self.audio_dropped += 1
            return True

    async def send_audio(self, pcm: bytes) -> None:
        link = self._require_link()
        if self.hung_up_by_bot or not link.is_open:
            self.audio_dropped += 1
            return
        protocol = self.protocol
        try:
            await link.send_texts([protocol.media(chunk) for chunk in self.bridge.to_wire(pcm)])
        except ProviderClosedError:
            self.audio_dropped += 1

    async def send_dtmf(self, digit: str) -> None:
        link = self._require_link()
        if self.hung_up_by_bot or not link.is_open:
            return
        with contextlib.suppress(ProviderClosedError):
            await link.send_texts([self.protocol.dtmf(digit)])

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        self._require_link()  # the protocol has no text: a bot hears the caller, nothing else

    async def create_response(self, *, instructions: str | None = None) -> None:
        self._require_link()  # the bot decides when it speaks

    async def cancel_response(self) -> None:
        self._require_link()  # barge-in is the bot's (clear); the gateway never cancels it

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        self._require_link()

    async def delete_item(self, item_id: str) -> None:
        self._require_link()

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        self._require_link()  # only the bot's own hang-up runs as a tool; its output has nowhere to go

    def _require_link(self) -> ProviderLink:
        link = self._link
        if link is None or self._closing:
            raise ProviderClosedError(f"{self.name}: stream is closed", retryable=False)
        return link

    # ---------------------------------------------------------------------------------- from the bot

    def parse(self, raw: str | bytes) -> Sequence[ProviderEvent]:
        """The link's parser: one bot message -> session events. Never raises (one bad message is survived)."""
        try:
            return [event for bot_event in self.protocol.receive(raw) for event in self._events_of(bot_event)]
        except Exception as exc:  # a bug of ours must not end the receive task either
            log.exception("%s: cannot handle a bot message", self.name)
            return [ProviderErrored(code="bot_internal_error", message=f"{type(exc).__name__}: {exc}", fatal=False)]

    def _events_of(self, event: BotEvent) -> list[ProviderEvent]:
        if isinstance(event, BotAudioReceived):
            return self._audio(event.payload)
        if isinstance(event, BotMarked):
            return self._mark(event.name)
        if isinstance(event, BotCleared):
            return self._clear()
        assert isinstance(event, BotMessageRejected)
        return [self._rejected(event.reason, event.detail)]

    def _audio(self, payload: bytes) -> list[ProviderEvent]:
        ledger = self.ledger
        ms = self.bridge.wire_ms(len(payload))
        if not ledger.admits(ms):
            self.protocol.counters.rejected["overflow"] += 1
            if self._overflowing:
                return []
            self._overflowing = True
            detail = f"the bot is more than {ledger.max_queued_ms / 1000:g} s ahead of the caller; audio refused"
            return [self._rejected("overflow", detail)]
        self._overflowing = False
        events: list[ProviderEvent] = []
        pcm = self.bridge.from_wire(payload)
        if pcm:
            events.extend(self._audio_events(pcm))
        token = ledger.delivered(ms)
        if token is not None:
            events.append(AudioMarked(marker=token, reached=self._marker_reached))
        return events

    def _audio_events(self, pcm: bytes) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        if not self._response_id:
            self._response_id = f"bot_resp_{next(self._ids)}"
            self._item_id = f"bot_item_{next(self._ids)}"
            events.append(ResponseStarted(response_id=self._response_id))
        events.append(AudioReceived(response_id=self._response_id, item_id=self._item_id, content_index=0, pcm=pcm))
        return events

    def _end_utterance(self) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        tail = self.bridge.flush()
        if tail:
            events.extend(self._audio_events(tail))
        if self._response_id:
            events.append(AudioDone(response_id=self._response_id, item_id=self._item_id))
            events.append(ResponseDone(response_id=self._response_id, status="completed"))
            self._response_id = self._item_id = ""
        return events

    def _mark(self, name: str) -> list[ProviderEvent]:
        token = self.ledger.bot_mark(name)
        if token is None:
            return [self._rejected("too_many_marks", f"mark {name[:40]!r} refused: too many marks wait")]
        # The utterance before the mark ends here, so its last part-frame is padded and the mark can be reached.
        return [*self._end_utterance(), AudioMarked(marker=token, reached=self._marker_reached)]

    def _clear(self) -> list[ProviderEvent]:
        self.bridge.flush()  # a part-frame of cleared audio is dropped with the rest
        self.ledger.cleared()
        self._response_id = self._item_id = ""
        return [ResponseInterrupted()]

    def _rejected(self, reason: str, detail: str) -> ProviderErrored:
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("%s: bot message dropped (%s): %s; further ones are counted", self.name, reason, detail)
        else:
            log.debug("%s: bot message dropped (%s): %s", self.name, reason, detail)
        return ProviderErrored(code=f"bot_{reason}", message=detail, fatal=False)

    # ------------------------------------------------------------------------------------------ marks

    def _marker_reached(self, token: str, cleared: bool) -> None:
        """Called by the session's playout (in the media tick, or at a barge-in): answer a bot mark."""
        name = self.ledger.reached(token)
        link = self._link
        if name is None or link is None or self._closing or self.hung_up_by_bot:
            return
        try:
            if not self._outbox and link.send_texts_nowait([self.protocol.mark(name)]):
                return
        except ProviderClosedError:
            return  # the receive task reports the disconnect
        self._outbox.append(name)
        self._outbox_wake.set()

    async def _writer(self) -> None:
        """Answers the marks the tick could not write at once, in order, through the link's send path."""
        link = self._link
        assert link is not None
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake.clear()
            while self._outbox:
                name = self._outbox[0]
                try:
                    await link.send_texts([self.protocol.mark(name)])
                except ProviderError:
                    self._outbox.clear()
                    return
                self._outbox.popleft()

    # -------------------------------------------------------------------------------------- lifecycle

    def disconnected(self, code: int | None, reason: str) -> ProviderDisconnected:
        """The link's end: how the bot closed the socket decides what the session does next."""
        if code == 1000:
            self.hung_up_by_bot = True
            return ProviderDisconnected(reason="the bot ended the stream (code 1000)", retryable=False)
        text = f"the bot closed the stream (code {code}{': ' + reason if reason else ''})"
        return ProviderDisconnected(reason=text, retryable=code is None or code in RETRYABLE_CLOSE_CODES)

    def events(self) -> AsyncIterator[ProviderEvent]:
        link = self._link
        assert link is not None
        return _BotEvents(self, link.events())

    def bot_hang_up_events(self) -> list[ProviderEvent]:
        """What the bot's 1000 close asks of the session: end the utterance, then the built-in hang-up."""
        call_id = f"bot_hang_up_{self.session_id}"
        arguments = '{"reason": "the bot ended the media stream"}'
        return [*self._end_utterance(), ToolCallRequested(call_id=call_id, name=BOT_HANG_UP_TOOL, arguments=arguments)]

    @property
    def closing(self) -> bool:
        return self._closing

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def aclose(self) -> None:
        """Send ``stop`` (when the socket is still open) and close with 1000. Idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            task, self._writer_task = self._writer_task, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise asyncio.CancelledError
            link = self._link
            if link is not None:
                if link.is_open and not self.protocol.stopped:
                    with contextlib.suppress(ProviderError, TimeoutError):
                        async with asyncio.timeout(1.0):
                            await link.send_texts([self.protocol.stop()])
                await link.aclose()
        finally:
            self._closed.set()
            c = self.protocol.counters
            log.info(
                "%s closed: media sent %d received %d, marks %d/%d, clears %d, dtmf %d, dropped %s",
                self.name,
                c.media_sent,
                c.media_received,
                c.marks_received,
                c.marks_sent,
                c.clears_received,
                c.dtmf_sent,
                dict(c.rejected) or "none",
            )


class _BotEvents:
    """The link's events, except that the bot's 1000 close becomes a hang-up request: ProviderDisconnected then
    waits for :meth:`BotSession.aclose`, so the session plays the queued audio out before it ends the call. A
    class, not an async generator: see ``_link.Events``."""

    def __init__(self, session: BotSession, inner: AsyncIterator[ProviderEvent]) -> None:
        self._session = session
        self._inner = inner
        self._pending: deque[ProviderEvent] = deque()
        self._wait_close = False
        self._ended = False

    def __aiter__(self) -> _BotEvents:
        return self

    async def __anext__(self) -> ProviderEvent:
        if self._pending:
            return self._pending.popleft()
        if self._ended:
            raise StopAsyncIteration
        if self._wait_close:
            await self._session.wait_closed()
            self._ended = True
            return ProviderDisconnected(reason="closed by client", retryable=False)
        event = await self._inner.__anext__()
        if not isinstance(event, ProviderDisconnected):
            return event
        session = self._session
        if session.hung_up_by_bot and not session.closing:
            self._pending.extend(session.bot_hang_up_events())
            self._wait_close = True
            return await self.__anext__()
        self._ended = True
        return event


class WebsocketBotModel:
    """A bot endpoint as a :class:`gateway.providers.base.RealtimeModel`."""

    name = "websocket"

    def __init__(self, config: BotConfig) -> None:
        self.config = config
        self.capabilities = Capabilities(
            server_vad=True,  # turn-taking and barge-in are the bot's (clear): the session runs no VAD of its own
            truncate=False,
            resume_handle=False,
            max_connection_s=None,
            g711_passthrough=True,
            quiet_chunks=False,  # a bot expects 20 ms of caller audio every 20 ms, silence included
            speaks=False,  # it cannot be asked to say a goodbye
        )
        self._streams = itertools.count(1)

    def headers(self, url: str) -> dict[str, str]:
        config = self.config
        headers = dict(config.headers)
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        if config.twilio_auth_token:
            headers["X-Twilio-Signature"] = twilio_signature(url, config.twilio_auth_token)
        return headers

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> BotSession:
        """Open a stream to the bot and send ``connected`` and ``start``. History and handles are not
        used: a bot keeps its own state, and a resumed call is a new stream of the same callSid."""
        config = self.config
        spec = profile.bot or BotSpec()
        url = spec.url or config.url
        if not url.startswith(("ws://", "wss://")):
            raise ProviderConfigError("websocket: set the bot's URL (GATEWAY_BOT_URL or the profile's bot.url)")
        bridge = AudioBridge(MediaFormat(wire=spec.audio or config.audio), profile.audio_format)
        context = dict(profile.call_context)
        call_key = context.get("call_id") or uuid.uuid4().hex
        identity = StreamIdentity(
            stream_sid=twilio_sid("MZ", uuid.uuid4().hex),
            call_sid=twilio_sid("CA", hashlib.sha256(call_key.encode()).hexdigest()),
            account_sid=config.account_sid,
        )
        protocol = StreamProtocol(
            identity=identity,
            media_format=bridge.media_format,
            custom_parameters={**spec.parameters, **context},
        )
        name = f"bot-{identity.stream_sid[:10]}"
        safe_url = redact_url(url)
        try:
            ws = await open_websocket(url, self.headers(url), open_timeout=config.open_timeout_s)
        except ProviderConnectError as exc:
            # Its message names the URL, which may carry a token: name the redacted one instead.
            raise ProviderConnectError(str(exc).replace(url, safe_url), retryable=exc.retryable) from None
        try:
            for data in protocol.opening():
                await ws.send(data, text=True)
        except Exception as exc:
            await ws.close()
            raise ProviderConnectError(f"{safe_url}: the bot closed the stream at start", retryable=True) from exc
        session = BotSession(
            protocol=protocol,
            bridge=bridge,
            ledger=PlayoutLedger(max_queued_ms=config.max_queued_s * 1000.0),
            name=name,
        )
        link = ProviderLink(
            ws, name=name, parse=session.parse, disconnected=session.disconnected, queue_size=config.event_queue_size
        )
        session.attach(link)
        link.start((SessionStarted(session_id=identity.stream_sid, resumed=False),))
        log.info("%s: stream to %s started (call %s, %s)", name, safe_url, identity.call_sid, bridge.media_format.wire)
        return session
