"""The greeting's words for answering-machine detection: a recogniser on the side while the AMD gate is open.

A provider that can transcribe a greeting without answering it (the cascaded pipeline: a second recogniser of
its STT, gateway/providers/pipeline/greeting.py) offers ``greeting_transcriber(profile)``. A profile that names
an ``amd_stt`` component gets a recogniser of that component whatever its provider, from the side source the
worker hands the session (:func:`words_source`). The session opens one when the call starts, feeds it the
callee's frames while AMD listens, and hands every text to the gate
(:meth:`~gateway.session.amd_gate.AmdGate.words`). The gate's hold bounds the wait: a recogniser that is slow, fails
or never opens only means the timing verdict stands. Realtime providers' input transcription does not apply:
it transcribes audio sent to the provider, and AMD sends the provider none (hence ``amd_stt`` for them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.providers.base import AgentProfile
from gateway.providers.errors import ProviderError

log = logging.getLogger(__name__)

_BACKLOG_FRAMES = 250  # 5 s of 20 ms frames kept while the recogniser opens


class GreetingTranscriber(Protocol):
    failure: str  # why texts() ended early ("" while it runs)

    def feed(self, pcm: npt.NDArray[np.int16]) -> None: ...

    def texts(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


class GreetingTranscribing(Protocol):
    async def greeting_transcriber(self, profile: AgentProfile) -> GreetingTranscriber: ...


def transcribes_greetings(model: object) -> bool:
    """Whether ``model`` (a RealtimeModel) offers a greeting recogniser."""
    return callable(getattr(model, "greeting_transcriber", None))


def words_source(
    model: object, profile: AgentProfile, side: GreetingTranscribing | None, *, call_id: str
) -> GreetingTranscribing | None:
    """Where the greeting's words come from: the side source for a profile naming ``amd_stt``, else the provider's
    own recogniser if it offers one (the pipeline's STT), else none (the timing rules alone)."""
    if profile.amd_stt is not None:
        if side is not None:
            return side
        log.warning("call %s: amd_stt %r: this worker builds no side recogniser", call_id, profile.amd_stt.name)
    if transcribes_greetings(model):
        return model  # type: ignore[return-value]  # it has greeting_transcriber(profile)
    return None


class AmdListener:
    """One call's greeting recogniser: :meth:`run` as an owned task, :meth:`feed` from the media tick."""

    def __init__(
        self,
        model: GreetingTranscribing,
        profile: AgentProfile,
        *,
        on_text: Callable[[str], None],
        call_id: str,
        open_deadline_s: float = 3.0,
    ) -> None:
        self._model = model
        self._profile = profile
        self._on_text = on_text
        self._call_id = call_id
        self._open_deadline_s = open_deadline_s
        self._stt: GreetingTranscriber | None = None
        self._backlog: deque[npt.NDArray[np.int16]] | None = deque(maxlen=_BACKLOG_FRAMES)
        self.texts = 0

    def feed(self, pcm: npt.NDArray[np.int16]) -> None:
        if self._stt is not None:
            self._stt.feed(pcm)
        elif self._backlog is not None:
            self._backlog.append(pcm.copy())  # the tick may reuse the frame's buffer

    async def run(self) -> None:
        """Open the recogniser, hand on its texts until cancelled (the gate closed) or it ends; then close it."""
        stt: GreetingTranscriber | None = None
        try:
            stt = await asyncio.wait_for(self._model.greeting_transcriber(self._profile), timeout=self._open_deadline_s)
            backlog, self._backlog = self._backlog or deque(), None
            log.info("call %s: AMD greeting recogniser open, %d frames held meanwhile", self._call_id, len(backlog))
            for pcm in backlog:
                stt.feed(pcm)
            self._stt = stt
            async for text in stt.texts():
                self.texts += 1
                self._on_text(text)
            log.warning("call %s: AMD greeting recogniser ended: %s", self._call_id, stt.failure or "no reason given")
        except (TimeoutError, OSError, ValueError, ProviderError) as exc:
            log.warning("call %s: AMD without words: the greeting recogniser failed: %s", self._call_id, exc)
        finally:
            self._stt, self._backlog = None, None
            if stt is not None:
                await _close(stt, self._call_id)


async def _close(stt: GreetingTranscriber, call_id: str) -> None:
    try:
        await stt.aclose()
    except Exception as exc:
        log.warning("call %s: closing the greeting recogniser failed: %s", call_id, exc)
