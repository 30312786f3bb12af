"""FLAC files bounded by their STREAMINFO block before miniaudio decodes them.

miniaudio (dr_flac) takes a FLAC's length from STREAMINFO's total-samples
field and libmtmd's helper allocates that many samples first: a header that
claims ten hours is ten hours of floats, and one that says 0 (unknown) leaves
a buffer of nothing that libmtmd then asserts on. Here STREAMINFO is read
(its sample rate, channels and total), the other metadata blocks walked within
the file, and a clip is taken only when its stated length is known and
within ``max_seconds`` and audio follows the metadata. A FLAC that states
less than it holds is decoded to the length it states, never more.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.audio.sound import MIN_SECONDS, check_rate, clock
from localllm.errors import InputError

MAX_BLOCKS = 1024  # metadata blocks (pictures, tags, padding): a real file has a few


@dataclass(frozen=True)
class FlacInfo:
    sample_rate: int
    channels: int
    bits: int
    n_frames: int  # samples per channel, as STREAMINFO states
    audio_offset: int  # where the first audio frame starts


def is_flac(data: bytes) -> bool:
    return data[:4] == b"fLaC"


def measure(data: bytes, name: str, max_seconds: float) -> FlacInfo:
    """STREAMINFO of the FLAC ``data``; ``InputError`` (one line naming ``name``) for
    one with no length, a zero rate, too long a length, or no audio after its metadata."""
    if not is_flac(data):
        raise InputError(f"audio {name} is not a FLAC file (no fLaC header)")
    if len(data) < 4 + 4 + 34 or data[4] & 0x7F != 0:
        raise InputError(f"audio {name} is a FLAC without its STREAMINFO block (damaged or cut short)")
    si = data[8:8 + 34]
    rate = (si[10] << 12) | (si[11] << 4) | (si[12] >> 4)
    channels = ((si[12] >> 1) & 7) + 1
    bits = (((si[12] & 1) << 4) | (si[13] >> 4)) + 1
    total = ((si[13] & 0x0F) << 32) | int.from_bytes(si[14:18], "big")
    check_rate(name, rate, "FLAC")
    if total == 0:
        raise InputError(f"audio {name} is a FLAC that does not state its length (a stream's capture): re-encode it (flac -f in.flac, sox)")
    if total / rate > max_seconds:
        raise InputError(f"audio {name} lasts {clock(total / rate)} by its FLAC header; at most {clock(max_seconds)} is taken: "
                         f"cut it first (sox in.flac out.flac trim 0 {int(max_seconds)})")
    if total / rate < MIN_SECONDS:
        raise InputError(f"audio {name} is {1000 * total / rate:.0f} ms long: too short to hear (at least {int(MIN_SECONDS * 1000)} ms)")
    pos = 4
    for _ in range(MAX_BLOCKS):
        if pos + 4 > len(data):
            raise InputError(f"audio {name} is a FLAC cut short inside its metadata")
        last, size = data[pos] & 0x80, int.from_bytes(data[pos + 1:pos + 4], "big")
        pos += 4 + size
        if pos > len(data):
            raise InputError(f"audio {name}'s FLAC metadata claims {size} bytes past the end of the file (cut short, or a lying header)")
        if last:
            break
    else:
        raise InputError(f"audio {name} has over {MAX_BLOCKS} FLAC metadata blocks (damaged)")
    if len(data) - pos < 2 or data[pos] != 0xFF or data[pos + 1] & 0xFE != 0xF8:
        raise InputError(f"audio {name} is a FLAC with no audio after its header (cut short)")
    return FlacInfo(rate, channels, bits, total, pos)
