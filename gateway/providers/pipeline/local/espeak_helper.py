"""The espeak-ng helper process: libespeak-ng behind a pipe, so the GPL-3.0 engine stays at arm's length.

The gateway never loads libespeak-ng into its own process (docs/adr/0024-local-gpl-engines-in-a-helper-process.md).
It runs this file as a separate program (``python -I -S espeak_helper.py``; the standard library only) and speaks a
line protocol over its stdin and stdout:

- start-up: the helper writes one JSON line, ``{"ready": true, "rate": 22050, "version": "1.51"}`` or
  ``{"error": "..."}`` (and exits);
- request: one JSON line ``{"text": str, "voice": str, "wpm": int}``;
- answer: one JSON line ``{"samples": n, "words": [[char_start, char_length, audio_ms], ...]}`` (or
  ``{"error": "..."}``), followed by exactly ``n`` samples of PCM16 LE at the announced rate. ``char_start``
  counts characters (code points) of ``text`` from 0; ``audio_ms`` is where espeak-ng's WORD event puts the
  word in this answer's audio.

The helper exits when its stdin closes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys
from typing import Any

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_BUFFER_MS = 60
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_RATE = 1  # espeakRATE
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_LIBRARIES = ("libespeak-ng.so.1", "libespeak-ng.so")


class _EventId(ctypes.Union):
    _fields_ = (("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8))


class _Event(ctypes.Structure):
    """espeak_EVENT (speak_lib.h)."""

    _fields_ = (
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    )


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


def _load() -> Any:
    errors = []
    names = [*_LIBRARIES, ctypes.util.find_library("espeak-ng")]
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError("libespeak-ng not found (Debian: apt-get install libespeak-ng1): " + "; ".join(errors))


class _Synth:
    def __init__(self) -> None:
        self.lib = _load()
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Synth.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        )
        self.lib.espeak_SetVoiceByName.argtypes = (ctypes.c_char_p,)
        self.lib.espeak_Info.restype = ctypes.c_char_p
        self.rate = int(self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, None, 0))
        if self.rate <= 0:
            raise OSError(f"espeak_Initialize failed ({self.rate})")
        self.version = (self.lib.espeak_Info(None) or b"").decode(errors="replace")
        self._chunks: list[bytes] = []
        self._words: list[list[int]] = []
        self._callback = _Callback(self._on_audio)  # kept referenced: the library calls it later
        self.lib.espeak_SetSynthCallback(self._callback)
        self._voice = ""

    def _on_audio(self, wav: Any, samples: int, events: Any) -> int:
        if samples > 0:
            self._chunks.append(ctypes.string_at(wav, samples * 2))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            if event.type == _EVENT_WORD:
                self._words.append([event.text_position - 1, event.length, event.audio_position])
            i += 1
        return 0

    def speak(self, text: str, voice: str, wpm: int) -> tuple[bytes, list[list[int]]]:
        if voice != self._voice:
            if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self._voice = voice
        self.lib.espeak_SetParameter(_RATE, int(wpm), 0)
        self._chunks, self._words = [], []
        data = text.encode() + b"\0"
        buffer = ctypes.create_string_buffer(data, len(data))
        status = self.lib.espeak_Synth(buffer, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if status != 0:
            raise OSError(f"espeak_Synth failed ({status})")
        self.lib.espeak_Synchronize()
        return b"".join(self._chunks), self._words


def _write_line(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def main() -> int:
    out = sys.stdout.buffer
    try:
        synth = _Synth()
    except (OSError, AttributeError) as exc:
        _write_line(out, {"error": str(exc)})
        return 1
    _write_line(out, {"ready": True, "rate": synth.rate, "version": synth.version})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            pcm, words = synth.speak(str(request["text"]), str(request["voice"]), int(request["wpm"]))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            _write_line(out, {"error": str(exc)})
            continue
        _write_line(out, {"samples": len(pcm) // 2, "words": words})
        out.write(pcm)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
