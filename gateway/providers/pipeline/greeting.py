"""The callee's greeting to a recogniser of its own, for answering-machine detection's words.

While AMD listens (gateway/session/amd_gate.py) the callee's audio does not reach the pipeline, so its STT hears
nothing. :class:`GreetingTranscriber` is a second recogniser built from the same profile's STT component (local
Whisper or a cloud one): it is fed the greeting, finalises each utterance after ``endpoint_ms`` of silence (by
frame energy, below -50 dBFS: a recording's pauses are clean) and yields the final texts. Partial texts are not used: a
greeting's first partial ("Hi, ...") would read as a person. The session closes it when AMD has decided.

:class:`GreetingRecognisers` builds one from a profile's own ``amd_stt`` component instead, whatever the profile's
provider (a realtime one included): the worker hands it to each session (gateway/session/amd_listen.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from gateway.media.amd import frame_voiced
from gateway.providers.base import AgentProfile
from gateway.providers.errors import ProviderConnectError, ProviderError
from gateway.providers.pipeline import components
from gateway.providers.pipeline._aio import Resampler
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.ports import SpeechToText, SttFailed, SttFinal

_SPEECH_DBFS = -50.0  # below the timing rules' -42: a greeting's soft last syllable must not end the utterance


class GreetingTranscriber:
    def __init__(self, stt: SpeechToText, *, endpoint_ms: int = 500) -> None:
        self._stt = stt
        self._rate = Resampler(stt.input_rate)
        self._endpoint_s = endpoint_ms / 1000
        self._silent_s = 0.0
        self._speaking = False
        self.failure = ""

    def feed(self, pcm: npt.NDArray[np.int16]) -> None:
        """One callee frame (24 kHz PCM16)."""
        self._stt.feed(self._rate.process(pcm.astype("<i2").tobytes()))
        if frame_voiced(pcm, _SPEECH_DBFS):
            self._speaking, self._silent_s = True, 0.0
            return
        self._silent_s += pcm.size / 24_000
        if self._speaking and self._silent_s >= self._endpoint_s:
            self._speaking = False
            self._stt.finalize()

    async def texts(self) -> AsyncIterator[str]:
        """The final text of each utterance; ends when the recogniser fails (``failure`` says why)."""
        async for event in self._stt.events():
            if isinstance(event, SttFinal) and event.text.strip():
                yield event.text
            elif isinstance(event, SttFailed):
                self.failure = event.message
                return

    async def aclose(self) -> None:
        await self._stt.aclose()


class GreetingRecognisers:
    """Greeting recognisers of the STT component a profile names in ``amd_stt``, with the worker's keys and URLs."""

    def __init__(self, context: ComponentContext, *, endpoint_ms: int = 500) -> None:
        self.context = context
        self.endpoint_ms = endpoint_ms

    async def greeting_transcriber(self, profile: AgentProfile) -> GreetingTranscriber:
        """A connected recogniser of ``profile.amd_stt``; :class:`ProviderConnectError` when it cannot be had."""
        spec = profile.amd_stt
        if spec is None:
            raise ProviderConnectError(f"profile {profile.name!r} names no amd_stt", retryable=False)
        try:
            stt = await components.build("stt", spec, self.context)
        except ProviderError as exc:
            raise ProviderConnectError(f"amd_stt {spec.name}: {exc}", retryable=exc.retryable) from exc
        except Exception as exc:  # a vendor's or a local model's own error: only the words are lost
            raise ProviderConnectError(f"amd_stt {spec.name}: {type(exc).__name__}: {exc}", retryable=True) from exc
        return GreetingTranscriber(stt, endpoint_ms=self.endpoint_ms)
