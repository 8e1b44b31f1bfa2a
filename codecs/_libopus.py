"""The few libopus functions :mod:`telcodecs.opus` calls, bound with ctypes.

Which library: the system's ``libopus.so.0`` (Debian ``libopus0``) when the dynamic linker finds it, else the
copy that PyAV's wheel ships in ``av.libs/`` (FFmpeg's libopus encoder and decoder are built on it). Both are
the reference implementation; :func:`library` says which one was loaded. Why libopus is called directly and
not through PyAV: docs/adr/0012-libopus-called-directly.md.

Encoder and decoder states live in Python-owned buffers (``opus_*_get_size`` then ``opus_*_init``), so they
are freed with the Python object and nothing needs a destructor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Final

OPUS_OK: Final = 0
OPUS_APPLICATION_VOIP: Final = 2048
OPUS_SET_BITRATE: Final = 4002
OPUS_SET_COMPLEXITY: Final = 4010
OPUS_SET_INBAND_FEC: Final = 4012
OPUS_SET_PACKET_LOSS_PERC: Final = 4014
MAX_PACKET_BYTES: Final = 1275 * 3 + 7  # RFC 6716 3.2.5: the largest packet of up to 120 ms


class LibopusNotFoundError(OSError):
    """Neither the system's libopus nor PyAV's copy of it could be loaded."""


@dataclass(frozen=True, slots=True)
class Libopus:
    """The loaded library, its path and version, and its functions with their C signatures set."""

    path: str
    version: str
    lib: ctypes.CDLL

    def strerror(self, code: int) -> str:
        message: bytes = self.lib.opus_strerror(code)
        return message.decode("ascii", "replace")


def _candidates() -> list[str]:
    system = ctypes.util.find_library("opus")
    return ([system] if system is not None else []) + _pyav_copies()


def _pyav_copies() -> list[str]:
    """The libopus PyAV's manylinux wheel ships beside its FFmpeg (``av.libs/libopus-<hash>.so.*``)."""
    try:
        import av
    except ImportError:  # pragma: no cover - av is a dependency
        return []
    return [str(path) for path in sorted((Path(av.__file__).parent.parent / "av.libs").glob("libopus*.so*"))]


def _bind(lib: ctypes.CDLL) -> None:
    c_int, c_int32, c_void_p, c_char_p = ctypes.c_int, ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p
    lib.opus_get_version_string.restype = c_char_p
    lib.opus_get_version_string.argtypes = []
    lib.opus_strerror.restype = c_char_p
    lib.opus_strerror.argtypes = [c_int]
    lib.opus_encoder_get_size.restype = c_int
    lib.opus_encoder_get_size.argtypes = [c_int]
    lib.opus_encoder_init.restype = c_int
    lib.opus_encoder_init.argtypes = [c_void_p, c_int32, c_int, c_int]
    # opus_encoder_ctl is variadic; every request used here takes one opus_int32, which the x86-64 and
    # AArch64 Linux calling conventions pass as they would a fixed int argument.
    lib.opus_encoder_ctl.restype = c_int
    lib.opus_encoder_ctl.argtypes = [c_void_p, c_int, c_int32]
    lib.opus_encode.restype = c_int32
    lib.opus_encode.argtypes = [c_void_p, c_void_p, c_int, c_void_p, c_int32]
    lib.opus_decoder_get_size.restype = c_int
    lib.opus_decoder_get_size.argtypes = [c_int]
    lib.opus_decoder_init.restype = c_int
    lib.opus_decoder_init.argtypes = [c_void_p, c_int32, c_int]
    lib.opus_decode.restype = c_int
    lib.opus_decode.argtypes = [c_void_p, c_char_p, c_int32, c_void_p, c_int, c_int]
    lib.opus_packet_get_nb_samples.restype = c_int
    lib.opus_packet_get_nb_samples.argtypes = [c_char_p, c_int32, c_int32]


@functools.cache
def load() -> Libopus:
    """The library, loaded once; :class:`LibopusNotFoundError` names every place that was tried."""
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            _bind(lib)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path} ({exc})")
            continue
        version: bytes = lib.opus_get_version_string()
        return Libopus(path=path, version=version.decode("ascii", "replace"), lib=lib)
    raise LibopusNotFoundError(
        "libopus not found: install the system package (Debian: libopus0) or PyAV's wheel, which ships it"
        + (f"; tried {', '.join(tried)}" if tried else "")
    )
