"""In-band DTMF (gateway/media/inband.py) on real speech: espeak-ng sentences in several voices must give no digit
(talk-off), digits under speech must all be heard, and tones played by one call decode back at the other end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from gateway.media.inband import InbandDtmf
from telcodecs.dtmf import DtmfError, tone
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE
from tests.support.audio import read_wav, speech_wav

SENTENCES = (
    "Please hold while I transfer you to the billing department.",
    "Your account number is four five six seven, is that right?",
    "Thank you for calling. How can I help you today?",
    "I would like to change my delivery address to Seventy Nine Ocean Drive.",
    "The weather tomorrow will be sunny with a high of twenty three degrees.",
)
VOICES = ("en-us", "en-gb", "en-us+f3", "de", "fr")


def _speech(tmp_path: Path, text: str, voice: str) -> npt.NDArray[np.int16]:
    wav = read_wav(speech_wav(text, tmp_path / "s.wav", rate=SAMPLE_RATE, voice=voice))
    return np.asarray(wav.samples, dtype=np.int16).reshape(-1)


def _heard(pcm: npt.NDArray[np.int16]) -> list[str]:
    """What the tick's detector finds in ``pcm``, fed as the tick feeds it: one 20 ms frame at a time."""
    inband = InbandDtmf(detect=True)
    pcm = np.concatenate([pcm, np.zeros(-pcm.size % FRAME_SAMPLES, np.int16)])
    return [d for frame in pcm.reshape(-1, FRAME_SAMPLES) for d in inband.heard(frame)]


@pytest.mark.parametrize("voice", VOICES)
def test_speech_gives_no_digits(tmp_path: Path, voice: str) -> None:
    for text in SENTENCES:
        speech = _speech(tmp_path, text, voice)
        for gain in (0.5, 1.0, 2.0):  # quiet, as rendered, and hot (clipped)
            loud = np.clip(speech.astype(np.float64) * gain, -32768, 32767).astype(np.int16)
            assert _heard(loud) == [], f"talk-off: {voice!r} x{gain} {text!r}"


def test_digits_under_speech_are_heard(tmp_path: Path) -> None:
    speech = _speech(tmp_path, SENTENCES[1], "en-us").astype(np.float64) * 0.3  # about 10 dB under the tones
    digits = "159#"
    signal = speech.copy()
    step = speech.size // (len(digits) + 1)
    for i, digit in enumerate(digits, start=1):
        press = tone(digit, duration_ms=80, sample_rate=SAMPLE_RATE, level_dbfs=-12.0).astype(np.float64)
        signal[i * step : i * step + press.size] += press
    assert _heard(np.clip(signal, -32768, 32767).astype(np.int16)) == list(digits)


def test_queued_tones_decode_back_and_end() -> None:
    sender, receiver = InbandDtmf(detect=False), InbandDtmf(detect=True)
    assert not sender.sending and not sender.detecting and receiver.detecting
    sender.queue("0123456789*#ABCD")
    heard: list[str] = []
    frames = 0
    while sender.sending:
        frame = sender.next_frame()
        assert frame.pcm.size == FRAME_SAMPLES and frame.index == frames
        heard += receiver.heard(frame.pcm)
        frames += 1
    assert "".join(heard) == "0123456789*#ABCD"
    assert frames == 16 * 160 // 20  # each press 100 ms and a 60 ms pause
    assert sender.heard(np.zeros(FRAME_SAMPLES, np.int16)) == []


def test_a_bad_digit_is_refused_and_queues_nothing() -> None:
    sender = InbandDtmf(detect=False)
    with pytest.raises(DtmfError):
        sender.queue("1x")
    assert not sender.sending
