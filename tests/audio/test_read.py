"""Sound files into clips (localllm.audio): espeak-ng's speech read, hostile files refused in one line, fast."""

from __future__ import annotations

import struct
import subprocess
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from localllm.audio import flac, mpeg, wav
from localllm.audio.read import decode_audio, load_audio
from localllm.audio.sound import MAX_SECONDS, clock
from localllm.errors import InputError
from tests.audio.conftest import SENTENCE, need, speak, tone, wav_bytes


def refused(data: bytes, *words: str, max_seconds: float = MAX_SECONDS) -> str:
    """The one-line refusal of ``data``, which must name each of ``words``, come fast, and
    take memory bounded by the file's size, not by what its header claims (measured)."""
    t0 = time.perf_counter()
    with pytest.raises(InputError) as exc:
        decode_audio(data, name="x.wav", max_seconds=max_seconds)
    assert time.perf_counter() - t0 < 2.0
    tracemalloc.start()  # again, traced (slower): the peak of what the refusal allocated
    try:
        with pytest.raises(InputError):
            decode_audio(data, name="x.wav", max_seconds=max_seconds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(data) + 8 * 2**20, (peak, len(data))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("audio x.wav")
    for w in words:
        assert w in msg, msg
    return msg


def test_espeak_speech_is_read(speech_wav: Path) -> None:
    clip = load_audio(speech_wav)
    assert clip.format == "wav" and clip.sample_rate == 22050 and clip.channels == 1
    assert 1.5 < clip.seconds < 6 and clip.label.startswith("fox.wav (0:0")
    h = wav.parse(clip.data, "c", MAX_SECONDS)  # handed on as a plain float WAV of the same samples
    assert (h.tag, h.channels, h.bits, h.sample_rate, h.n_frames) == (3, 1, 32, 22050, clip.n_frames)
    raw = wav.samples(speech_wav.read_bytes(), wav.parse(speech_wav.read_bytes(), "f", MAX_SECONDS))
    assert np.array_equal(wav.samples(clip.data, h), raw) and np.abs(raw).max() > 0.05  # speech, not silence


@pytest.mark.parametrize("bits,tag", [(8, 1), (16, 1), (24, 1), (32, 3), (64, 3)])
def test_pcm_and_float_widths_decode_to_the_same_mono(bits: int, tag: int) -> None:
    x = tone(0.5, 16000)
    stereo = np.stack([x, x], axis=1)
    clip = decode_audio(wav_bytes(stereo, 16000, bits=bits, tag=tag), name="t.wav")
    got = wav.samples(clip.data, wav.parse(clip.data, "t", MAX_SECONDS))
    assert clip.channels == 2 and clip.n_frames == len(x)
    assert np.abs(got - x).max() < (0.02 if bits == 8 else 1e-3)


def test_a_header_that_lies_about_its_size() -> None:
    refused(wav_bytes(tone(0.5, 16000), 16000, data_size=0x7FFFFFF0), "claims", "holds", "lies about its size")


def test_a_file_cut_short() -> None:
    full = wav_bytes(tone(2.0, 16000), 16000)
    refused(full[: len(full) // 2], "claims 64000 bytes", "holds 31978", "cut short")


def test_zero_sample_rate_channels_and_a_damaged_block() -> None:
    good = bytearray(wav_bytes(tone(0.5, 16000), 16000))
    for offset, value, words in ((24, 0, ("0 Hz",)), (22, 0, ("0 channels",)), (32, 3, ("block of 3 bytes",)), (24, 7, ("7 Hz",))):
        bad = bytearray(good)
        struct.pack_into("<I" if offset == 24 else "<H", bad, offset, value)
        refused(bytes(bad), *words)


def test_ten_hours_is_refused_before_a_sample_is_decoded() -> None:
    """A real ten-hour WAV (1 kHz, 8-bit: 36 MB), and one whose header claims ten hours in a few bytes."""
    x = np.zeros(10 * 3600 * 1000, np.float32)
    refused(wav_bytes(x, 1000, bits=8), "lasts 10:00:00", "at most 10:00.0", "cut it first")
    refused(wav_bytes(tone(0.5, 16000), 16000, data_size=10 * 3600 * 16000 * 2), "claims 1152000000 bytes", "lies about its size")


def test_the_limit_holds_for_a_real_length_too() -> None:
    refused(wav_bytes(tone(3.0, 8000), 8000), "lasts 0:03.0", "at most 0:02.0", max_seconds=2.0)


def test_too_short_empty_and_not_audio() -> None:
    refused(wav_bytes(tone(0.01, 16000), 16000), "10 ms long", "too short")
    refused(b"OggS" + bytes(100), "Ogg", "convert it")
    refused(bytes(4) + b"ftypM4A " + bytes(100), "MP4/M4A")
    refused(b"hello, world" * 10, "not a sound file")
    with pytest.raises(InputError, match="empty"):
        decode_audio(b"", name="x.wav")


def test_paths_that_are_no_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    with pytest.raises(InputError, match="is a folder"):
        load_audio(tmp_path)
    import os

    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_audio(fifo)


def _mp3_frame(*, xing_frames: int | None = None) -> bytes:
    """One MPEG-1 Layer III frame, 128 kbps, 44.1 kHz, stereo (417 bytes), with a Xing tag where asked."""
    body = bytearray(417)
    body[0:4] = b"\xff\xfb\x90\x00"
    if xing_frames is not None:
        body[36:40] = b"Xing"
        struct.pack_into(">II", body, 40, 1, xing_frames)
    return bytes(body)


def test_an_mp3_bomb_whose_tag_claims_billions_of_frames() -> None:
    msg = refused(_mp3_frame(xing_frames=0xFFFFFFF0) + _mp3_frame() * 10, "MP3 header claims", "exhaust memory")
    assert clock(0xFFFFFFF0 * 1152 / 44100) in msg


def test_an_mp3_of_hours_of_the_smallest_frames_stops_at_the_limit() -> None:
    small = b"\xff\xe3\x18\xc0" + bytes(68)  # MPEG-2.5 Layer III, 8 kbps, 8 kHz, mono: 72 bytes, 576 samples (72 ms)
    assert mpeg.frame(small, 0) == mpeg.Frame(72, 576, 8000, 1)
    bomb = small * (3600 * 8000 // 576)  # an hour of sound in 3.6 MB
    refused(bomb, "lasts over 10:00.0", "frames counted so far")
    assert mpeg.measure(small * 100, "m", MAX_SECONDS).n_frames == 57600  # 7.2 s: walked and counted


def test_free_format_and_frameless_mp3s() -> None:
    refused(b"\xff\xfb\x00\x00" + bytes(500), "free-format")
    refused(b"ID3\x03\x00\x00\x7f\x7f\x7f\x7f" + bytes(20), "ID3 tag claims")
    refused(b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\xf0\x00" + bytes(40), "no MP3 frame")


def test_a_real_mp3_is_measured_as_its_wav(tmp_path: Path) -> None:
    need("lame")
    src = speak(SENTENCE, tmp_path / "s.wav")
    out = tmp_path / "s.mp3"
    subprocess.run(["lame", "--quiet", "-b", "32", str(src), str(out)], check=True, timeout=60)
    clip = load_audio(out)
    assert clip.format == "mp3" and clip.data == out.read_bytes()
    assert abs(clip.seconds - load_audio(src).seconds) < 0.15  # the encoder's padding: a frame or two


def test_flac_is_bounded_by_its_streaminfo(tmp_path: Path) -> None:
    path = speak(SENTENCE, tmp_path / "s.flac", fmt="flac")
    data = path.read_bytes()
    clip = load_audio(path)
    assert clip.format == "flac" and abs(clip.seconds - load_audio(speak(SENTENCE, tmp_path / "s.wav")).seconds) < 0.01

    def patched(total: int | None = None, rate: int | None = None) -> bytes:
        b = bytearray(data)
        si = 8
        if rate is not None:
            b[si + 10], b[si + 11] = rate >> 12 & 0xFF, rate >> 4 & 0xFF
            b[si + 12] = (b[si + 12] & 0x0F) | (rate & 0x0F) << 4
        if total is not None:
            b[si + 13] = (b[si + 13] & 0xF0) | (total >> 32 & 0x0F)
            b[si + 14:si + 18] = (total & 0xFFFFFFFF).to_bytes(4, "big")
        return bytes(b)

    refused(patched(total=0), "does not state its length")
    refused(patched(rate=0), "0 Hz")
    refused(patched(total=10 * 3600 * 22050), "lasts 10:00:00 by its FLAC header")
    refused(data[:60], "FLAC")
    with pytest.raises(InputError, match="not a FLAC"):
        flac.measure(b"RIFF", "x", MAX_SECONDS)
