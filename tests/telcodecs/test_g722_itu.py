"""Opt-in conformance check: the ITU-T G.722 Appendix II digital test sequences, when a directory of them is given.

This is not a peer test and does not run by default: the sequences are ITU copyright and cannot ship with the
project. Set ``G722_ITU_VECTORS`` to a directory holding them (the ASCII files ``T1C1.XMT`` ... ``T3H3.RC0`` of
the original distribution, or the little-endian binary ``bt1c1.xmt`` ... of the 2012 one; names in any case),
and these tests run on the sequences it holds (a partial set runs its complete pairs; one with none fails);
without it they skip, saying so. CI does not set it.

What runs (the ITU test configurations bypass the QMFs, so they test the two ADPCM coders):

- **Encoder**, configuration 1: ``T1C1.XMT -> T2R1.COD`` and ``T1C2.XMT -> T2R2.COD`` (each input word is one
  15-bit sub-band sample, both bands; the expected code is the reference word's upper octet).
- **Decoder**, configuration 2, in all three modes (64, 56, 48 kbit/s): ``T2R1.COD -> T3L1.RC1..3 + T3H1.RC0``,
  ``T2R2.COD -> T3L2.* + T3H2.RC0`` and ``T1D3.COD -> T3L3.* + T3H3.RC0``.
- **Our codec on the same sequences, QMFs in place**: every ``*.COD`` decoded by telcodecs.g722 and FFmpeg must
  agree bit for bit, and every ``*.XMT`` encoded by telcodecs.g722, FFmpeg and spandsp too.

Who can bypass the QMFs: spandsp (its ``itu_test_mode``, see telcodecs.g722_peers), so the sequences run on
spandsp. libg722, which telcodecs.g722 uses, has the same switch in its C state but its Python module does not
reach it (docs/adr/0021-g722-through-libg722.md); so the chain of evidence is: spandsp's ADPCM coders pass the
ITU sequences here, and tests/telcodecs/test_g722.py shows ours gives spandsp's codes for every signal and
FFmpeg's samples for every code stream, QMFs included.

In each sequence, leading and trailing words with the least significant bit set are the reset pattern, as in the
ITU's own test procedure; the data are the words between them.

``test_the_harness_*`` check this file's reading and comparing on sequences written in both formats from
spandsp's output, so that the opt-in check cannot rot unseen while no one has the vectors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from telcodecs.g722 import G722Decoder, G722Encoder
from telcodecs.g722_peers import FfmpegDecoder, FfmpegEncoder, SpandspDecoder, SpandspEncoder, spandsp_available
from tests.support.peers import unavailable

ENV = "G722_ITU_VECTORS"
ENCODE = (("T1C1.XMT", "T2R1.COD"), ("T1C2.XMT", "T2R2.COD"))
DECODE = (("T2R1.COD", "T3L1", "T3H1.RC0"), ("T2R2.COD", "T3L2", "T3H2.RC0"), ("T1D3.COD", "T3L3", "T3H3.RC0"))
MODES = {1: (64000, 8), 2: (56000, 9), 3: (48000, 10)}  # mode: (bit rate, shift of the code in a .COD word)


class VectorMissingError(LookupError):
    pass


def read_sequence(directory: Path, name: str) -> np.ndarray:
    """One test sequence as uint16 words: ``NAME`` in ASCII hex, or ``bNAME`` in 16-bit little-endian binary."""
    files = {path.name.upper(): path for path in directory.iterdir() if path.is_file()}
    if name.upper() in files:
        return parse_ascii(files[name.upper()].read_text(encoding="ascii", errors="replace"))
    if "B" + name.upper() in files:
        return np.frombuffer(files["B" + name.upper()].read_bytes(), dtype="<u2").astype(np.uint16)
    raise VectorMissingError(f"{name} (or b{name.lower()}) not in {directory}")


def parse_ascii(text: str) -> np.ndarray:
    """Lines of 4-digit hex words; lines starting ``/*`` are comments; a line's words end at the first non-hex."""
    words: list[int] = []
    for line in text.splitlines():
        if line.startswith("/*"):
            continue
        for start in range(0, len(line) - 3, 4):
            chunk = line[start : start + 4]
            try:
                words.append(int(chunk, 16))
            except ValueError:
                break
    return np.array(words, dtype=np.uint16)


def data_span(words: np.ndarray) -> tuple[int, int]:
    """[start, end) of the words between the leading and the trailing reset pattern (LSB set)."""
    even = np.flatnonzero((words & 1) == 0)
    if even.size == 0:
        raise ValueError("no data words: every word has its reset bit set")
    start = int(even[0])
    after = np.flatnonzero(words[start:] & 1)
    return start, start + int(after[0]) if after.size else words.shape[0]


def present(directory: Path, groups: tuple[tuple[str, ...], ...]) -> list[tuple[str, ...]]:
    """The groups of ``groups`` whose sequences are all in ``directory`` (a partial set runs what it holds; a
    decoder group needs its source and upper band, each of its modes its own lower band)."""
    files = {path.name.upper() for path in directory.iterdir() if path.is_file()}

    def held(name: str) -> bool:
        return "." not in name or name.upper() in files or "B" + name.upper() in files

    return [group for group in groups if all(held(name) for name in group)]


@dataclass(frozen=True, slots=True)
class Mismatch:
    sequence: str
    count: int
    total: int
    first: int

    def __str__(self) -> str:
        return f"{self.sequence}: {self.count} of {self.total} differ, first at word {self.first}"


def check_encoder(directory: Path) -> list[Mismatch]:
    """Configuration 1 on spandsp with its QMF bypassed; a Mismatch per sequence that differs."""
    out = []
    for source, reference in present(directory, ENCODE):
        words, expected = read_sequence(directory, source), read_sequence(directory, reference)
        start, end = data_span(words)
        codes = np.frombuffer(SpandspEncoder(itu_test_mode=True).encode(words[start:end].view(np.int16)), np.uint8)
        want = ((expected[start:end] >> 8) & 0xFF).astype(np.uint8)
        bad = np.flatnonzero(codes != want)
        if bad.size:
            out.append(Mismatch(f"{source} -> {reference}", int(bad.size), end - start, int(bad[0])))
    return out


def check_decoder(directory: Path) -> list[Mismatch]:
    """Configuration 2, modes 1-3, on spandsp with its QMF bypassed; a Mismatch per sequence that differs."""
    out = []
    for source, lower, upper in present(directory, DECODE):
        words = read_sequence(directory, source)
        start, end = data_span(words)
        want_upper = read_sequence(directory, upper)[start:end]
        for mode, (bit_rate, shift) in MODES.items():
            if not present(directory, ((f"{lower}.RC{mode}",),)):
                continue
            want_lower = read_sequence(directory, f"{lower}.RC{mode}")[start:end]
            codes = ((words[start:end] >> shift) & 0xFF).astype(np.uint8).tobytes()
            got = SpandspDecoder(bit_rate=bit_rate, itu_test_mode=True).decode(codes).view(np.uint16)
            bad = np.flatnonzero((got[0::2] != want_lower) | (got[1::2] != want_upper))
            if bad.size:
                out.append(Mismatch(f"{source} -> {lower}.RC{mode} + {upper}", int(bad.size), end - start, int(bad[0])))
    return out


def check_full_codec_agreement(directory: Path) -> list[str]:
    """Each sequence through the whole codecs (QMFs in place): ours against FFmpeg's and spandsp's encoders, ours
    against FFmpeg's decoder. Names of the sequences where they differ."""
    out = []
    for source, _ in present(directory, ENCODE):
        words = read_sequence(directory, source).view(np.int16)
        pcm = np.ascontiguousarray(words[: words.shape[0] - words.shape[0] % 320])  # FFmpeg codes whole frames
        ours = G722Encoder().encode(pcm)
        if ours != FfmpegEncoder().encode(pcm) or ours != SpandspEncoder().encode(pcm):
            out.append(f"encode {source}")
    for source, _, _ in present(directory, DECODE):
        codes = ((read_sequence(directory, source) >> 8) & 0xFF).astype(np.uint8).tobytes()
        if not np.array_equal(G722Decoder().decode(codes), FfmpegDecoder().decode(codes)):
            out.append(f"decode {source}")
    return out


def vectors() -> Path:
    value = os.environ.get(ENV, "")
    if not value:
        pytest.skip(
            f"{ENV} is not set: the ITU-T G.722 Appendix II sequences are ITU copyright and do not ship with the "
            "project; point it at a directory of them to run this opt-in conformance check"
        )
    directory = Path(value)
    if not directory.is_dir():
        pytest.fail(f"{ENV}={value} is not a directory")
    if not present(directory, ENCODE) and not present(directory, DECODE):
        pytest.fail(f"{ENV}={value} holds no complete ITU sequence pair (e.g. T1C2.XMT with T2R2.COD)")
    if not spandsp_available():
        unavailable("spandsp is not installed (apt-get install libspandsp2): it is the library that bypasses the QMF")
    return directory


def test_itu_encoder_sequences_configuration_1() -> None:
    mismatches = check_encoder(vectors())
    assert not mismatches, "; ".join(map(str, mismatches))


def test_itu_decoder_sequences_configuration_2_all_modes() -> None:
    mismatches = check_decoder(vectors())
    assert not mismatches, "; ".join(map(str, mismatches))


def test_itu_sequences_through_our_whole_codec_agree_with_ffmpeg_and_spandsp() -> None:
    differing = check_full_codec_agreement(vectors())
    assert not differing, ", ".join(differing)


# --- the harness itself, on sequences made here in the ITU's formats ---------------------------------------------


def _ascii(words: np.ndarray) -> str:
    lines = ["/* made by tests/telcodecs/test_g722_itu.py in the layout of the ITU files */"]
    for i in range(0, words.shape[0], 32):
        lines.append("".join(f"{int(w):04X}" for w in words[i : i + 32]))
    return "\r\n".join(lines) + "\r\n"


def _write_set(directory: Path, *, binary: bool, corrupt: str | None = None) -> None:
    rng = np.random.default_rng(2)
    reset = np.full(16, 1, dtype=np.uint16)  # the reset pattern: LSB set

    def framed(data: np.ndarray) -> np.ndarray:
        return np.concatenate([reset, data.astype(np.uint16), reset])

    sequences: dict[str, np.ndarray] = {}
    for source, reference in ENCODE:
        data = (rng.integers(-16384, 16384, 688).astype(np.int16) << 1).view(np.uint16)  # 15-bit words, LSB clear
        codes = np.frombuffer(SpandspEncoder(itu_test_mode=True).encode(data.view(np.int16)), np.uint8)
        sequences[source] = framed(data)
        sequences[reference] = framed(codes.astype(np.uint16) << 8)
    sequences["T1D3.COD"] = framed(rng.integers(0, 256, 688).astype(np.uint16) << 8)
    for source, lower, upper in DECODE:
        data = sequences[source][16:-16]
        for mode, (bit_rate, shift) in MODES.items():
            codes = ((data >> shift) & 0xFF).astype(np.uint8).tobytes()
            pairs = SpandspDecoder(bit_rate=bit_rate, itu_test_mode=True).decode(codes).view(np.uint16)
            sequences[f"{lower}.RC{mode}"] = framed(pairs[0::2])
            sequences[upper] = framed(pairs[1::2])  # the upper band decodes alike in every mode
    if corrupt is not None:
        sequences[corrupt] = sequences[corrupt].copy()
        sequences[corrupt][20] ^= 0x0100
    for name, words in sequences.items():
        if binary:
            (directory / f"b{name.lower()}").write_bytes(words.astype("<u2").tobytes())
        else:
            (directory / name).write_text(_ascii(words), encoding="ascii")


@pytest.fixture
def harness_spandsp() -> None:
    if not spandsp_available():
        unavailable("spandsp is not installed (apt-get install libspandsp2)")


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary-le"])
def test_the_harness_reads_both_formats_and_passes_consistent_sequences(
    tmp_path: Path, binary: bool, harness_spandsp: None
) -> None:
    _write_set(tmp_path, binary=binary)
    assert data_span(read_sequence(tmp_path, "T1C1.XMT")) == (16, 704)
    assert check_encoder(tmp_path) == []
    assert check_decoder(tmp_path) == []
    assert check_full_codec_agreement(tmp_path) == []


def test_the_harness_fails_a_changed_word_and_names_where(tmp_path: Path, harness_spandsp: None) -> None:
    _write_set(tmp_path, binary=False, corrupt="T2R2.COD")
    (mismatch,) = check_encoder(tmp_path)
    assert str(mismatch) == "T1C2.XMT -> T2R2.COD: 1 of 688 differ, first at word 4"
    _write_set(tmp_path, binary=False, corrupt="T3H3.RC0")
    failed = [m.sequence for m in check_decoder(tmp_path)]
    assert failed == [f"T1D3.COD -> T3L3.RC{mode} + T3H3.RC0" for mode in (1, 2, 3)]
    (tmp_path / "T3L1.RC1").unlink()  # a partial set runs what it holds: the other modes and sequences
    assert [m.sequence for m in check_decoder(tmp_path)] == failed
    (tmp_path / "T2R2.COD").unlink()
    assert present(tmp_path, ENCODE) == [("T1C1.XMT", "T2R1.COD")]
    assert ("T2R2.COD", "T3L2", "T3H2.RC0") not in present(tmp_path, DECODE)
    with pytest.raises(VectorMissingError, match=r"T2R2\.COD"):
        read_sequence(tmp_path, "T2R2.COD")
