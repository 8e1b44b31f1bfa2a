"""The session core against the real built-in echo agent (in-process, no network): audio comes back
byte-identical through playout, local VAD barge-in cancels the echo, DTMF text round-trips."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from gateway.providers.base import AgentProfile, AudioReceived, HistoryItem, ProviderEvent
from gateway.providers.echo import EchoModel
from gateway.session import LocalVadConfig
from gateway.session.events import BargedIn, TranscriptUpdated
from tests.gateway.session.fakes import _Pulse, call_tasks, fast_config, make_session, of_type, tone_frame, wait_event


class _Observed:
    """Delegates to a real provider session; counts the events the session core has taken and handled."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.handled: list[ProviderEvent] = []
        self.changed = _Pulse()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def events(self) -> AsyncIterator[ProviderEvent]:
        return _ObservedStream(self, self._inner.events())


class _ObservedStream:
    def __init__(self, owner: _Observed, inner: AsyncIterator[ProviderEvent]) -> None:
        self._owner = owner
        self._inner = inner
        self._taken: ProviderEvent | None = None

    def __aiter__(self) -> _ObservedStream:
        return self

    async def __anext__(self) -> ProviderEvent:
        # Asked for the next event: the listener has finished handling the previous one.
        if self._taken is not None:
            self._owner.handled.append(self._taken)
            self._owner.changed.fire()
        self._taken = await self._inner.__anext__()
        return self._taken


class _ObservedModel:
    def __init__(self, inner: EchoModel) -> None:
        self._inner = inner
        self.name = inner.name
        # The echo agent declares server VAD so real calls run no local VAD against it; this test
        # exercises the session's own VAD, so it presents the echo as a provider without one.
        self.capabilities = dataclasses.replace(inner.capabilities, server_vad=False)
        self.sessions: list[_Observed] = []

    async def connect(
        self, profile: AgentProfile, *, history: tuple[HistoryItem, ...] = (), resume_handle: str | None = None
    ) -> Any:
        session = _Observed(await self._inner.connect(profile, history=history, resume_handle=resume_handle))
        self.sessions.append(session)
        return session


def _audio_handled(session: _Observed) -> int:
    return sum(len(e.pcm) for e in session.handled if isinstance(e, AudioReceived)) // 960


async def test_echo_round_trip_barge_in_and_dtmf() -> None:
    model = _ObservedModel(EchoModel())
    config = fast_config(
        local_vad=LocalVadConfig(threshold_dbfs=-20.0, start_ms=40, hangover_ms=100), dtmf_template="DTMF {digit}"
    )
    session, _ = make_session(model, config=config)  # type: ignore[arg-type]
    await session.start()
    echo = model.sessions[0]

    frames = [tone_frame(i) for i in range(30)]  # about -30 dBFS: below the VAD threshold
    for frame in frames:
        session.push_inbound(frame)
    await echo.changed.until(lambda: _audio_handled(echo) >= 29)
    played = [session.pull_outbound() for _ in range(29)]
    assert b"".join(f.to_bytes() for f in played if f is not None) == b"".join(f.to_bytes() for f in frames[:29])

    for index in range(30, 33):  # the caller speaks up over the echo: barge-in
        session.push_inbound(tone_frame(index, level=12_000))
    event = await wait_event(session, of_type(BargedIn, trigger="local_vad"))
    assert event.cancelled and not event.truncated  # the echo agent has no truncate

    session.dtmf_received("5")
    reply = await wait_event(session, of_type(TranscriptUpdated, role="assistant"))
    assert reply.text == "You pressed 5"
    assert session.stats().errors == 0
    await session.aclose()
    assert call_tasks() == []
