"""Sound files (or a request's bytes) into ``AudioClip``s, bounded before anything is decoded.

The format is told by the bytes, never the name: a WAV (RIFF/WAVE), an MP3 (an
ID3 tag or an MPEG frame sync) or a FLAC (``fLaC``), the three libmtmd's
miniaudio reads. Each has its own reader (``wav``, ``mpeg``, ``flac``) that
checks the header against the file and bounds the length first; a file of
another kind is named (Ogg, MP4/M4A, WebM) with the conversion that fixes it.
"""

from __future__ import annotations

import hashlib
import os

from localllm.audio import flac, mpeg, wav
from localllm.audio.sound import MAX_BYTES, MAX_SECONDS, AudioClip
from localllm.errors import InputError
from localllm.util.user_file import read_user_file

_OTHER = ((b"OggS", "an Ogg (Vorbis/Opus) file"), (b"\x1aE\xdf\xa3", "a WebM/Matroska file"), (b"FORM", "an AIFF file"),
          (b"#!AMR", "an AMR file"), (b"caff", "a CAF file"))
SUFFIXES = (".wav", ".wave", ".mp3", ".flac")  # what the cockpit's attach and a completion offer as audio


def sniff(data: bytes) -> str | None:
    """``wav``, ``mp3``, ``flac``, or None."""
    if wav.is_wav(data) or data[:4] == b"RF64":
        return "wav"
    if flac.is_flac(data):
        return "flac"
    if mpeg.is_mp3(data):
        return "mp3"
    return None


def decode_audio(data: bytes, *, name: str = "audio", max_seconds: float = MAX_SECONDS, max_bytes: int = MAX_BYTES) -> AudioClip:
    """``data`` (a whole sound file, e.g. serve's base64 payload) as a clip;
    ``InputError`` with one line naming ``name`` and the cause."""
    if len(data) > max_bytes:
        raise InputError(f"audio {name} is {len(data) / 2**20:.0f} MiB, over the {max_bytes // 2**20} MiB limit for a sound file")
    if not data:
        raise InputError(f"audio {name} is empty")
    kind = sniff(data)
    sha = hashlib.sha256(data).hexdigest()
    if kind == "wav":
        h = wav.parse(data, name, max_seconds)
        body = wav.canonical(wav.samples(data, h), h.sample_rate)
        return AudioClip(name, "wav", body, h.sample_rate, h.channels, h.n_frames, len(data), sha)
    if kind == "flac":
        f = flac.measure(data, name, max_seconds)
        return AudioClip(name, "flac", data, f.sample_rate, f.channels, f.n_frames, len(data), sha)
    if kind == "mp3":
        m = mpeg.measure(data, name, max_seconds)
        return AudioClip(name, "mp3", data, m.sample_rate, m.channels, m.n_frames, len(data), sha)
    for magic, what in _OTHER:
        if data.startswith(magic):
            raise InputError(f"audio {name} is {what}: only WAV, MP3 and FLAC are read; convert it first (sox in out.wav, ffmpeg -i in out.wav)")
    if data[4:8] == b"ftyp":
        raise InputError(f"audio {name} is an MP4/M4A file: only WAV, MP3 and FLAC are read; convert it first (ffmpeg -i in.m4a out.wav)")
    raise InputError(f"audio {name} is not a sound file this tool reads (WAV, MP3, FLAC)")


def load_audio(path: str | os.PathLike[str], *, max_seconds: float = MAX_SECONDS, max_bytes: int = MAX_BYTES) -> AudioClip:
    """Read ``path`` as a clip, or raise ``InputError`` with one line naming the file and the cause."""
    p, data = read_user_file(path, kind="audio", give="a sound file", max_bytes=max_bytes, limit_for="a sound file")
    return decode_audio(data, name=p.name or str(p), max_seconds=max_seconds, max_bytes=max_bytes)


def is_audio_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s name says sound (the cockpit sorts attachments by it; the bytes decide the format)."""
    return str(path).lower().endswith(SUFFIXES)
