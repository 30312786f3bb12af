"""WAV files decoded here, every figure of the header checked against the file first.

miniaudio (what libmtmd decodes with) sizes its sample buffer by the ``data``
chunk's size as the header states it: a 1 KB file whose header claims 4 GB of
samples is a 4 GB allocation. Here the chunks are walked within the file's
bytes, the format's figures checked (a zero sample rate, zero channels, a block
that is not channels x bytes), the claimed length bounded (``max_seconds``)
and compared with what the file holds, and only then are the samples read with
numpy into mono float32 (the mean of the channels, as miniaudio mixes them).
``canonical`` writes them back as the plain float WAV handed to libmtmd.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from localllm.audio.sound import MIN_SECONDS, check_rate, clock
from localllm.errors import InputError

MAX_CHUNKS = 256  # a WAV has a handful (fmt, data, LIST, fact); past this it is no WAV
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
_BITS = {_PCM: (8, 16, 24, 32), _FLOAT: (32, 64)}


@dataclass(frozen=True)
class WavHeader:
    tag: int  # 1 PCM, 3 float
    channels: int
    sample_rate: int
    bits: int
    block: int  # bytes a frame
    offset: int  # where the samples start
    n_frames: int

    @property
    def seconds(self) -> float:
        return self.n_frames / self.sample_rate


def is_wav(data: bytes) -> bool:
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def parse(data: bytes, name: str, max_seconds: float) -> WavHeader:
    """The header of the WAV ``data``; ``InputError`` (one line naming ``name``) for
    a damaged, lying, truncated, too short or too long one. Reads no sample."""
    if data[:4] == b"RF64":
        raise InputError(f"audio {name} is an RF64 (64-bit) WAV: convert it to a plain WAV or FLAC first (sox in.wav out.flac)")
    if not is_wav(data):
        raise InputError(f"audio {name} is not a WAV file (no RIFF/WAVE header)")
    pos, fmt, found = 12, None, None
    for _ in range(MAX_CHUNKS):
        if pos + 8 > len(data):
            break
        cid, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + size > len(data):
                raise InputError(f"audio {name} has a damaged WAV header (a fmt chunk of {size} bytes)")
            fmt = struct.unpack_from("<HHIIHH", data, body)
            tag = fmt[0]
            if tag == _EXTENSIBLE:
                if size < 40:
                    raise InputError(f"audio {name} has a damaged WAV header (an extensible fmt chunk of {size} bytes)")
                tag = struct.unpack_from("<H", data, body + 24)[0]  # the sub-format GUID's first two bytes
            fmt = (tag, *fmt[1:])
        elif cid == b"data":
            found = (body, size)
            break
        pos = body + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise InputError(f"audio {name} is a WAV without a fmt chunk (damaged or cut short)")
    if found is None:
        raise InputError(f"audio {name} is a WAV without a data chunk (damaged or cut short)")
    tag, channels, rate, _byte_rate, block, bits = fmt
    if tag not in _BITS:
        raise InputError(f"audio {name} is a WAV in encoding {tag} (compressed): only PCM and float WAVs are read; "
                         f"convert it (sox in.wav -e signed -b 16 out.wav)")
    check_rate(name, rate, "WAV")
    if channels == 0:
        raise InputError(f"audio {name} has 0 channels in its WAV header (damaged)")
    if channels > 32:
        raise InputError(f"audio {name} has {channels} channels: at most 32 are taken (a damaged header?)")
    if bits not in _BITS[tag]:
        raise InputError(f"audio {name} holds {bits}-bit {'float' if tag == _FLOAT else 'PCM'} samples, which are not read "
                         f"(PCM 8/16/24/32, float 32/64)")
    if block != channels * bits // 8:
        raise InputError(f"audio {name} has a damaged WAV header (a block of {block} bytes, not {channels} x {bits // 8})")
    offset, size = found
    n_frames = size // block
    held = len(data) - offset
    if size > held:  # before the length: a 1 KB file claiming 4 GB is a lie, not a long recording
        raise InputError(f"audio {name}'s header claims {size} bytes of samples but the file holds {max(held, 0)} "
                         f"(cut short, or a header that lies about its size)")
    if n_frames / rate > max_seconds:
        raise InputError(f"audio {name} lasts {clock(n_frames / rate)}; at most {clock(max_seconds)} is taken: "
                         f"cut it first (sox in.wav out.wav trim 0 {int(max_seconds)})")
    if n_frames / rate < MIN_SECONDS:
        raise InputError(f"audio {name} is {1000 * n_frames / rate:.0f} ms long: too short to hear (at least {int(MIN_SECONDS * 1000)} ms)")
    return WavHeader(tag, channels, rate, bits, block, offset, n_frames)


def samples(data: bytes, h: WavHeader):
    """The header's samples as mono float32 in [-1, 1] (numpy)."""
    import numpy as np  # lazy: only audio needs it, and the engine has it loaded by then

    n = h.n_frames * h.channels
    if h.tag == _FLOAT:
        x = np.frombuffer(data, "<f4" if h.bits == 32 else "<f8", n, h.offset).astype(np.float32)
        x = np.clip(np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)  # NaN would reach the encoder's FFT
    elif h.bits == 8:
        x = (np.frombuffer(data, np.uint8, n, h.offset).astype(np.float32) - 128.0) / 128.0
    elif h.bits == 16:
        x = np.frombuffer(data, "<i2", n, h.offset).astype(np.float32) / 32768.0
    elif h.bits == 24:
        b = np.frombuffer(data, np.uint8, n * 3, h.offset).reshape(n, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    else:
        x = np.frombuffer(data, "<i4", n, h.offset).astype(np.float32) / float(1 << 31)
    if h.channels > 1:
        x = x.reshape(h.n_frames, h.channels).mean(axis=1, dtype=np.float32)
    return x


def canonical(mono, rate: int) -> bytes:
    """``mono`` (float32) as a plain WAV: format 3, one channel, ``rate`` Hz."""
    body = mono.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", _FLOAT, 1, rate, rate * 4, 4, 32)
    return b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(body)) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt \
        + b"data" + struct.pack("<I", len(body)) + body
