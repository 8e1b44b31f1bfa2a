"""The ``pipeline`` provider: a :class:`~gateway.providers.base.RealtimeModel` that builds one
:class:`~.session.PipelineSession` per call from the components its profile names.

A profile's :class:`~gateway.providers.base.PipelineSpec` (from the routes file) says which recogniser, chat model,
voice and voice detector to use; a profile without one gets :attr:`PipelineModel.default_spec` (from the
environment, :mod:`gateway.providers.registry`). ``AgentProfile.model`` and ``.voice`` name the chat model and the
TTS voice when set. The session core sees one more provider: it runs its own turn-taking (``server_vad``), can
truncate, keeps no server-side state (history is replayed on resume), and speaks on request.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from gateway.providers.base import AgentProfile, Capabilities, HistoryItem, PipelineSpec
from gateway.providers.errors import ProviderConfigError, ProviderConnectError, ProviderError
from gateway.providers.pipeline import components
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.greeting import GreetingTranscriber
from gateway.providers.pipeline.session import PipelineSession, SessionOptions
from gateway.providers.pipeline.turns import TurnOptions

CAPABILITIES = Capabilities(
    server_vad=True,
    truncate=True,
    resume_handle=False,
    max_connection_s=None,
    g711_passthrough=False,
    quiet_chunks=True,
    speaks=True,
)


def turn_options(spec: PipelineSpec) -> TurnOptions:
    return TurnOptions(
        onset_ms=spec.onset_ms,
        endpoint_ms=spec.endpoint_ms,
        max_endpoint_ms=spec.max_endpoint_ms,
        min_interrupt_ms=spec.min_interrupt_ms,
        false_interrupt_ms=spec.false_interrupt_ms,
    )


class PipelineModel:
    name = "pipeline"

    def __init__(
        self,
        default_spec: PipelineSpec,
        context: ComponentContext,
        *,
        component_deadline_s: float = 5.0,
    ) -> None:
        components.check(default_spec)
        self.default_spec = default_spec
        self.context = context
        self.component_deadline_s = component_deadline_s
        self.capabilities = CAPABILITIES
        self._sessions = itertools.count(1)
        self.sessions: list[PipelineSession] = []  # the live ones, newest last (tests and benches read them)

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> PipelineSession:
        """Build and connect the components; ``history`` seeds the chat history (a resumed call)."""
        if profile.audio_format != "pcm24k":
            raise ProviderConnectError("the pipeline speaks the 24 kHz PCM frame contract only", retryable=False)
        spec = profile.pipeline or self.default_spec
        try:
            components.check(spec)
            options = SessionOptions(turns=turn_options(spec), component_deadline_s=self.component_deadline_s)
        except (ProviderConfigError, ValueError) as exc:
            raise ProviderConnectError(f"pipeline: {exc}", retryable=False) from exc
        llm = spec.llm
        if profile.model and "model" not in llm.options:
            llm = type(llm)(name=llm.name, options={**llm.options, "model": profile.model})
        built: list[Any] = []
        try:
            vad = await components.build("vad", spec.vad, self.context)
            stt = await components.build("stt", spec.stt, self.context)
            built.append(stt)
            chat = await components.build("llm", llm, self.context)
            built.append(chat)
            tts = await components.build("tts", spec.tts, self.context)
            built.append(tts)
        except ProviderError as exc:
            await _close_all(built)
            raise ProviderConnectError(f"pipeline: {exc}", retryable=exc.retryable) from exc
        except Exception as exc:
            await _close_all(built)
            raise ProviderConnectError(f"pipeline: {type(exc).__name__}: {exc}", retryable=True) from exc

        async def open_stt() -> Any:
            return await components.build("stt", spec.stt, self.context)

        session = PipelineSession(
            profile=profile,
            stt=stt,
            open_stt=open_stt,
            chat=chat,
            tts=tts,
            vad=vad,
            options=options,
            history=history,
            session_id=f"pipeline_{next(self._sessions)}",
        )
        session.start()
        self.sessions = [s for s in self.sessions if not s.closed] + [session]
        return session

    async def greeting_transcriber(self, profile: AgentProfile) -> GreetingTranscriber:
        """A recogniser of the profile's STT (its ``amd_stt`` when it names one) for the callee's greeting
        (answering-machine detection's words)."""
        spec = profile.pipeline or self.default_spec
        try:
            stt = await components.build("stt", profile.amd_stt or spec.stt, self.context)
        except ProviderError as exc:
            raise ProviderConnectError(f"pipeline greeting stt: {exc}", retryable=exc.retryable) from exc
        return GreetingTranscriber(stt, endpoint_ms=min(spec.endpoint_ms, 500))


async def _close_all(built: list[Any]) -> None:
    for component in reversed(built):
        with contextlib.suppress(Exception):
            await component.aclose()
