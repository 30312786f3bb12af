"""The synthetic audio projector (scripts/make_audio_projector.py) for SmolLM2, and speech made by espeak-ng.

No audio model ships on PyPI: the projector is a whisper-style encoder of
random weights sized to SmolLM2-135M's n_embd (576), which libmtmd loads and
runs as it would a real one. The speech is espeak-ng's, made at test time
(Debian's espeak-ng and sox: scripts/install.sh --test installs them); a test
that needs a tool that is absent is skipped with the reason.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from scripts.make_audio_projector import AudioSpec, write_audio_projector

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="session")
def audio_projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Ultravox-type audio projector for SmolLM2 (125 tokens each 30 s chunk)."""
    return write_audio_projector(tmp_path_factory.mktemp("audio") / "mmproj-audio.gguf", AudioSpec())


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt-get install {tool}; scripts/install.sh --test installs it)")
    return path


def speak(text: str, out: Path, *, rate: int | None = None, fmt: str | None = None) -> Path:
    """``text`` spoken by espeak-ng into ``out`` (a WAV at 22050 Hz), converted by sox
    to ``rate`` Hz and to the format of ``out``'s suffix where asked."""
    espeak = need("espeak-ng")
    if out.suffix == ".wav" and rate is None:
        subprocess.run([espeak, "-w", str(out), text], check=True, capture_output=True, timeout=60)
        return out
    raw = out.with_name(out.stem + ".espeak.wav")
    subprocess.run([espeak, "-w", str(raw), text], check=True, capture_output=True, timeout=60)
    sox = need("sox")
    args = [sox, str(raw)] + (["-r", str(rate)] if rate else []) + (["-t", fmt] if fmt else []) + [str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"sox cannot write {out.suffix} here ({done.stderr.strip()[:120]}): apt-get install libsox-fmt-all")
    return out


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence spoken by espeak-ng (22050 Hz 16-bit mono, about 3 s)."""
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "fox.wav")


def wav_bytes(x: np.ndarray, rate: int, *, bits: int = 16, tag: int = 1, data_size: int | None = None) -> bytes:
    """A WAV of ``x`` (frames x channels, in [-1, 1]); ``data_size`` overrides the data chunk's stated size."""
    x = x.reshape(len(x), -1)
    ch = x.shape[1]
    if tag == 3:
        body = x.astype("<f4" if bits == 32 else "<f8").tobytes()
    elif bits == 16:
        body = (x * 32767).astype("<i2").tobytes()
    elif bits == 24:
        v = (x * 8388607).astype(np.int32).reshape(-1)
        body = np.stack([v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF], axis=1).astype(np.uint8).tobytes()
    else:
        body = (x * 127 + 128).astype(np.uint8).tobytes()
    block = ch * bits // 8
    fmt = struct.pack("<HHIIHH", tag, ch, rate, rate * block, block, bits)
    size = len(body) if data_size is None else data_size
    return b"RIFF" + struct.pack("<I", 36 + len(body)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + body


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
