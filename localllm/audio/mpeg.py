"""MP3 files measured frame by frame before miniaudio decodes them.

miniaudio (dr_mp3, ``$V/vendor/miniaudio/miniaudio.h``) takes an MP3's length
from the Xing/Info tag of its first frame when there is one, and libmtmd's
helper allocates that many samples before it reads any: a 1 KB file whose tag
claims four billion frames is an allocation of terabytes (the *MP3 bomb*).
Without a tag it counts the frames, so a file of tens of megabytes of the
smallest frames (72 bytes, 576 samples each) decodes to hours. Here the tag's
claim is read and bounded, and every frame header is walked (each gives its
own length and sample count, ``frame``), the sum bounded by ``max_seconds``
as it grows: the walk stops at the limit, so it costs at most the frames of
``max_seconds``. A free-format stream (bitrate index 0, frames of no stated
size) is refused: its frames cannot be walked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from localllm.audio.sound import MIN_SECONDS, clock
from localllm.errors import InputError

# kbps by [MPEG-1?][layer 1..3][index 1..14]
_RATES = {
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_HZ = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by the version bits
MAX_GARBAGE = 1 << 20  # bytes between frames (tags, junk) before the file is called no MP3


@dataclass(frozen=True)
class Frame:
    length: int  # bytes, header included
    samples: int  # per channel
    rate: int
    channels: int


@dataclass(frozen=True)
class Mp3Info:
    sample_rate: int  # the first frame's (miniaudio's output rate before resampling)
    channels: int
    n_frames: int  # samples per channel, at sample_rate (frames of another rate counted by their time)
    mp3_frames: int


class FreeFormat(Exception):
    """A header of bitrate index 0."""


def frame(data: bytes, pos: int) -> Frame | None:
    """The MPEG audio frame whose header is at ``pos``, or None when none is there."""
    if pos + 4 > len(data) or data[pos] != 0xFF or data[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2, b3 = data[pos + 1], data[pos + 2], data[pos + 3]
    version, layer_bits, index, hz = (b1 >> 3) & 3, (b1 >> 1) & 3, b2 >> 4, (b2 >> 2) & 3
    if version == 1 or layer_bits == 0 or index == 15 or hz == 3:
        return None  # reserved values: not a header
    if index == 0:
        raise FreeFormat
    layer = 4 - layer_bits
    mpeg1 = version == 3
    kbps, rate, pad = _RATES[(mpeg1, layer)][index - 1], _HZ[version][hz], (b2 >> 1) & 1
    if layer == 1:
        length, spf = (12 * kbps * 1000 // rate + pad) * 4, 384
    elif layer == 2 or mpeg1:
        length, spf = 144 * kbps * 1000 // rate + pad, 1152
    else:
        length, spf = 72 * kbps * 1000 // rate + pad, 576
    return Frame(length, spf, rate, 1 if b3 >> 6 == 3 else 2)


def is_mp3(data: bytes) -> bool:
    return data[:3] == b"ID3" or (len(data) >= 4 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


def _id3_end(data: bytes, name: str) -> int:
    if data[:3] != b"ID3":
        return 0
    if len(data) < 10 or any(b & 0x80 for b in data[6:10]):
        raise InputError(f"audio {name} has a damaged ID3 tag")
    size = (data[6] << 21) | (data[7] << 14) | (data[8] << 7) | data[9]
    end = 10 + size + (10 if data[5] & 0x10 else 0)
    if end > len(data):
        raise InputError(f"audio {name}'s ID3 tag claims {size} bytes but the file holds {len(data) - 10} (cut short, or a lying tag)")
    return end


def _xing_frames(data: bytes, pos: int, f: Frame) -> int | None:
    """The frame count a Xing/Info tag in the frame at ``pos`` claims (what dr_mp3 sizes its buffer by)."""
    head = data[pos + 4:pos + min(f.length, 64)]
    for tag in (b"Xing", b"Info"):
        k = head.find(tag)
        if k >= 0 and k + 12 <= len(head):
            flags = struct.unpack_from(">I", head, k + 4)[0]
            if flags & 1:
                return int(struct.unpack_from(">I", head, k + 8)[0])
    return None


def measure(data: bytes, name: str, max_seconds: float) -> Mp3Info:
    """Walk the MP3 ``data``'s frames; ``InputError`` (one line naming ``name``) for
    one that claims or holds more than ``max_seconds``, holds no frame, or is damaged."""
    pos = _id3_end(data, name)
    first: Frame | None = None
    seconds, count, garbage = 0.0, 0, 0
    try:
        while pos + 4 <= len(data):
            if data[pos:pos + 3] == b"TAG" and len(data) - pos == 128:
                break  # an ID3v1 tag closes the file
            f = frame(data, pos)
            if f is None:
                nxt = data.find(b"\xff", pos + 1)
                nxt = len(data) if nxt < 0 else nxt
                garbage += nxt - pos
                if garbage > MAX_GARBAGE:
                    raise InputError(f"audio {name} is not an MP3 file this tool reads (over {MAX_GARBAGE >> 20} MiB that are no MP3 frames)")
                pos = nxt
                continue
            if first is None:
                first = f
                claimed = _xing_frames(data, pos, f)
                if claimed is not None and claimed * f.samples / f.rate > max_seconds:
                    raise InputError(f"audio {name}'s MP3 header claims {clock(claimed * f.samples / f.rate)} of sound; at most "
                                     f"{clock(max_seconds)} is taken (a damaged file, or one made to exhaust memory)")
            seconds += f.samples / f.rate
            count += 1
            if seconds > max_seconds:
                raise InputError(f"audio {name} lasts over {clock(max_seconds)} (its frames counted so far); at most "
                                 f"{clock(max_seconds)} is taken: cut it first (sox in.mp3 out.mp3 trim 0 {int(max_seconds)})")
            pos += f.length
    except FreeFormat:
        raise InputError(f"audio {name} is a free-format MP3 (frames of no stated size), which is not read: re-encode it (lame, sox)") from None
    if first is None:
        raise InputError(f"audio {name} holds no MP3 frame (damaged, or not an MP3)")
    if seconds < MIN_SECONDS:
        raise InputError(f"audio {name} is {seconds * 1000:.0f} ms long: too short to hear (at least {int(MIN_SECONDS * 1000)} ms)")
    return Mp3Info(first.rate, first.channels, round(seconds * first.rate), count)
