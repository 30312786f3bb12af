"""The audio a prompt carries, and the bounds every reader holds it to.

libmtmd takes audio as mono float samples at its encoder's rate (16 kHz for the
whisper-style encoders), which miniaudio (``$V/tools/mtmd/mtmd-helper.cpp``)
decodes and resamples from a file's bytes. A clip holds the bytes handed to it:
an MP3 or a FLAC as it came, once ``read`` has walked its frames or header and
bounded its length; a WAV as a plain float32 mono WAV written from our own
decode, so a header that lies about its size never reaches miniaudio (which
would size its buffer by the header).
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.errors import InputError

MAX_SECONDS = 600.0  # ten minutes: a long meeting should be cut first; 20 chunks of 30 s, each encoded whole
MIN_SECONDS = 0.05  # shorter is no sound to hear (and libmtmd asserts on a clip of one sample)
MAX_BYTES = 128 * 1024 * 1024  # a file: ten minutes of 48 kHz stereo 24-bit WAV is 173 MB, of 16-bit 115 MB
MIN_RATE, MAX_RATE = 1000, 384_000  # Hz; 0 or a few Hz is a damaged header, 384 kHz the highest rate sold
FORMATS = ("wav", "mp3", "flac")


@dataclass(frozen=True)
class AudioClip:
    """A sound file checked and bounded: ``data`` is what libmtmd's decoder reads."""

    name: str  # the file name, for chips and messages
    format: str  # "wav", "mp3" or "flac": the file's
    data: bytes  # a float32 mono WAV (from a WAV), or the MP3 / FLAC file itself
    sample_rate: int  # the file's, in Hz
    channels: int  # the file's (the encoder hears their mean)
    n_frames: int  # samples per channel, as counted (a WAV's data, an MP3's frames, a FLAC's header)
    file_bytes: int
    sha256: str  # of the file's bytes: the same file is the same audio to the cache

    @property
    def seconds(self) -> float:
        return self.n_frames / self.sample_rate

    @property
    def label(self) -> str:
        return f"{self.name} ({clock(self.seconds)})"


def clock(seconds: float) -> str:
    """``m:ss.s`` under an hour, ``h:mm:ss`` past it: a clip's length in a chip or a message."""
    if seconds >= 3600:
        s = int(seconds)
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}:{rest:04.1f}"


def check_rate(name: str, rate: int, container: str) -> None:
    """A header's sample rate, refused in one line where it is 0 or out of ``MIN_RATE``..``MAX_RATE``
    (``container``: the format whose header said it, WAV or FLAC)."""
    if rate == 0:
        raise InputError(f"audio {name} has a sample rate of 0 Hz in its {container} header (damaged)")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InputError(f"audio {name} has a sample rate of {rate} Hz: {MIN_RATE} to {MAX_RATE} Hz is taken (a damaged header?)")
