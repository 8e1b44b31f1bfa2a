"""Worker settings that shape the media: the callers' jitter-buffer policy and the collector's pacing."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.media.jitter import JitterConfig
from gateway.worker.settings import WorkerSettings
from gateway.worker.slices import SessionSettings


def test_default_jitter_policy_is_the_jitter_buffers_own() -> None:
    assert WorkerSettings().media.jitter_config == JitterConfig()


def test_jitter_bounds_and_hold_shape_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_JITTER_MIN_DELAY_MS", "60")
    monkeypatch.setenv("GATEWAY_JITTER_MAX_DELAY_MS", "600")
    monkeypatch.setenv("GATEWAY_JITTER_HOLD_S", "0")
    config = WorkerSettings().media.jitter_config
    assert (config.min_delay_ms, config.max_delay_ms, config.shrink_hold_frames) == (60, 600, 0)
    assert config.start_delay_ms == 60  # the start delay is kept inside the bounds
    assert config.horizon_ms == 1200  # a discontinuity is still told from the deepest buffer
    assert WorkerSettings(jitter_max_delay_ms=600, jitter_hold_s=2.5).media.jitter_config.shrink_hold_frames == 125


def test_a_low_ceiling_brings_the_start_delay_down_with_it() -> None:
    assert WorkerSettings(jitter_max_delay_ms=30).media.jitter_config.start_delay_ms == 30


@pytest.mark.parametrize(
    "bad",
    [
        {"jitter_min_delay_ms": 300, "jitter_max_delay_ms": 200},
        {"jitter_min_delay_ms": 10},
        {"jitter_max_delay_ms": 25},  # not whole 10 ms units
        {"jitter_hold_s": -1},
    ],
)
def test_a_jitter_setting_that_cannot_work_is_refused_at_start(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        WorkerSettings(**bad)  # type: ignore[arg-type]


def test_the_collector_pacing_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (WorkerSettings().gc.gc_paced, WorkerSettings().gc.gc_full_interval_s) == (True, 120.0)
    monkeypatch.setenv("GATEWAY_GC_PACED", "false")
    monkeypatch.setenv("GATEWAY_GC_FULL_INTERVAL_S", "600")
    assert (WorkerSettings().gc.gc_paced, WorkerSettings().gc.gc_full_interval_s) == (False, 600.0)


@pytest.mark.parametrize("value", ["0", "-5", "never"])
def test_a_full_collection_interval_that_cannot_work_is_refused_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GATEWAY_GC_FULL_INTERVAL_S", value)
    with pytest.raises(ValidationError, match="gc_full_interval_s"):
        WorkerSettings()


def test_a_quiet_callers_chunk_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (WorkerSettings().session.provider_quiet_chunk_ms, WorkerSettings().session.provider_quiet_after_ms) == (
        100,
        1000,
    )
    monkeypatch.setenv("GATEWAY_PROVIDER_QUIET_CHUNK_MS", "20")
    monkeypatch.setenv("GATEWAY_PROVIDER_QUIET_AFTER_MS", "2000")
    assert (WorkerSettings().session.provider_quiet_chunk_ms, WorkerSettings().session.provider_quiet_after_ms) == (
        20,
        2000,
    )
    monkeypatch.setenv("GATEWAY_PROVIDER_QUIET_CHUNK_MS", "50")
    with pytest.raises(ValidationError, match="provider_quiet_chunk_ms"):
        WorkerSettings()


def test_a_call_takes_capacity_by_its_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = WorkerSettings()
    assert (defaults.costs.capacity, defaults.costs.opus_call_cost, defaults.costs.webrtc_call_cost) == (150, 8.0, 18.0)
    assert defaults.costs.g722_call_cost == 2.0
    assert [defaults.costs.call_cost(codec) for codec in ("PCMU", "PCMA", "opus", "G722")] == [1.0, 1.0, 8.0, 2.0]
    assert defaults.offer_cost() == 8.2  # our offer lists Opus and (OSRTP) SRTP: the callee may pick both
    assert WorkerSettings(codecs=("PCMU", "PCMA"), srtp="off").offer_cost() == 1.0
    assert WorkerSettings(codecs=("G722", "PCMU"), srtp="off").offer_cost() == 2.0
    # SRTP adds srtp_call_cost to any codec; our offers count it unless SRTP is off.
    assert defaults.costs.srtp_call_cost == 0.2
    assert [defaults.costs.call_cost(codec, srtp=True) for codec in ("PCMU", "G722", "opus")] == [1.2, 2.2, 8.2]
    assert WorkerSettings(codecs=("PCMU",), srtp="required").offer_cost() == 1.2
    assert WorkerSettings(codecs=("PCMU",), srtp="off").offer_cost() == 1.0
    monkeypatch.setenv("GATEWAY_OPUS_CALL_COST", "5.5")
    assert WorkerSettings().costs.call_cost("opus") == 5.5
    monkeypatch.setenv("GATEWAY_G722_CALL_COST", "2")
    assert WorkerSettings().costs.call_cost("G722") == 2.0


def test_codecs_default_to_wideband_first_and_take_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().media.codecs == ("G722", "PCMU", "PCMA", "opus")
    monkeypatch.setenv("GATEWAY_CODECS", "pcmu, g722")
    assert WorkerSettings().media.codecs == ("PCMU", "G722")
    monkeypatch.setenv("GATEWAY_CODECS", "G729")
    with pytest.raises(ValidationError, match="G722, PCMU, PCMA, opus"):
        WorkerSettings()


@pytest.mark.parametrize("name", ["opus_call_cost", "g722_call_cost", "webrtc_call_cost"])
@pytest.mark.parametrize("bad", [0.5, 0, -1, 1001])
def test_a_call_cost_below_a_g711_calls_or_absurd_is_refused(name: str, bad: float) -> None:
    with pytest.raises(ValidationError, match=name):
        WorkerSettings(**{name: bad})


@pytest.mark.parametrize("bad", [-0.1, 101])
def test_an_srtp_call_cost_below_nothing_or_absurd_is_refused(bad: float) -> None:
    assert WorkerSettings(srtp_call_cost=0).costs.call_cost("PCMU", srtp=True) == 1.0  # 0: SRTP counted as free
    with pytest.raises(ValidationError, match="srtp_call_cost"):
        WorkerSettings(srtp_call_cost=bad)


def test_the_opus_encode_ahead_budget_comes_from_the_environment_and_a_negative_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_OPUS_ENCODE_AHEAD_MS", "0")
    assert WorkerSettings().media.opus_encode_ahead_ms == 0.0
    monkeypatch.setenv("GATEWAY_OPUS_ENCODE_AHEAD_MS", "-1")
    with pytest.raises(ValidationError, match="opus_encode_ahead_ms"):
        WorkerSettings()


def test_srtp_settings_from_the_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from gateway.commands.worker_args import add_worker_arguments, worker_settings

    assert WorkerSettings().media.srtp == "optional"
    assert WorkerSettings().media.srtp_suites == ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
    monkeypatch.setenv("GATEWAY_SRTP", "Required")
    monkeypatch.setenv("GATEWAY_SRTP_SUITES", "aes_cm_128_hmac_sha1_32")
    settings = WorkerSettings()
    assert (settings.media.srtp, settings.media.srtp_suites) == ("required", ("AES_CM_128_HMAC_SHA1_32",))
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    flags = worker_settings(
        parser.parse_args(
            [
                *("--srtp", "off", "--srtp-suites", "AES_CM_128_HMAC_SHA1_80"),
                *("--srtp-call-cost", "0.5", "--g722-call-cost", "1.5"),
            ]
        )
    )
    assert (flags.media.srtp, flags.media.srtp_suites) == ("off", ("AES_CM_128_HMAC_SHA1_80",))
    assert flags.costs.call_cost("G722", srtp=True) == 2.0
    for bad in ({"srtp": "maybe"}, {"srtp_suites": "AEAD_AES_256_GCM"}, {"srtp_suites": ""}):
        with pytest.raises(ValueError):
            WorkerSettings(**bad)  # type: ignore[arg-type]


def test_a_call_whose_agent_runs_whisper_here_costs_the_local_stt_call_cost() -> None:
    from dataclasses import replace

    import gateway.providers.pipeline.local  # noqa: F401  (registers whisper, silero, espeak, rules)
    from gateway.providers.base import AgentProfile, ComponentSpec, PipelineSpec
    from gateway.providers.echo import EchoConfig, EchoModel
    from gateway.providers.pipeline.components import ComponentContext
    from gateway.providers.pipeline.model import PipelineModel
    from gateway.worker.slices import CapacitySettings

    costs = CapacitySettings(local_stt_call_cost=12.5)
    local = PipelineSpec(
        stt=ComponentSpec(name="whisper"),
        llm=ComponentSpec(name="rules"),
        tts=ComponentSpec(name="espeak"),
        vad=ComponentSpec(name="silero"),
    )
    cloud = replace(local, stt=ComponentSpec(name="deepgram"))
    model = PipelineModel(cloud, ComponentContext())
    profile = AgentProfile(provider="pipeline")
    assert costs.agent_cost(model, profile) == 0.0  # the default spec transcribes in the cloud
    assert costs.agent_cost(model, replace(profile, pipeline=local)) == 12.5
    assert costs.agent_cost(PipelineModel(local, ComponentContext()), profile) == 12.5
    assert costs.agent_cost(EchoModel(EchoConfig()), AgentProfile()) == 0.0


def _wav(path: Path, samples: np.ndarray, rate: int, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return path


def test_hold_audio_is_read_at_start_up_as_24_khz_pcm(tmp_path: Path) -> None:
    t = np.arange(16000) / 16000
    music = _wav(tmp_path / "music.wav", 8000 * np.sin(2 * np.pi * 660 * t), 16000)
    settings = SessionSettings(hold_audio_file=str(music))
    pcm = np.frombuffer(settings.session_config().hold_audio, dtype="<i2")
    assert pcm.size == 24000, "one second at 24 kHz"
    spectrum = np.abs(np.fft.rfft(pcm.astype(float)))
    assert abs(float(np.fft.rfftfreq(pcm.size, 1 / 24000)[int(np.argmax(spectrum))]) - 660) < 2
    assert SessionSettings().session_config().hold_audio == b"", "no file: the built-in tone"


def test_a_hold_audio_file_that_cannot_be_played_is_refused_at_start_up(tmp_path: Path) -> None:
    stereo = _wav(tmp_path / "stereo.wav", np.zeros(200), 8000, channels=2)
    with pytest.raises(ValidationError, match="need mono 16-bit PCM"):
        SessionSettings(hold_audio_file=str(stereo))
    with pytest.raises(ValidationError, match="GATEWAY_HOLD_AUDIO_FILE"):
        SessionSettings(hold_audio_file=str(tmp_path / "missing.wav"))
    odd_rate = _wav(tmp_path / "odd.wav", np.zeros(200), 11025)
    with pytest.raises(ValidationError, match="11025 Hz"):
        SessionSettings(hold_audio_file=str(odd_rate))
