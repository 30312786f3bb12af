"""Picture files into RGB bytes for libmtmd, bounded before they are decoded.

libmtmd's own reader (stb_image, ``$V/tools/mtmd/mtmd-helper.cpp``) has no WebP
and decodes whatever size a header claims, so images are read here with Pillow
and handed over as ``mtmd_bitmap_init(nx, ny, rgb)`` wants them: ``nx * ny * 3``
bytes, row by row. Every check that can be made on the file and on the header
(a regular file, its size, the format, the pixel count) runs before a pixel is
decoded: a decompression bomb (a small file that claims 30000 x 30000 pixels)
costs a header read and one line. A GIF or an animated WebP gives its first
frame, and no later frame is ever read (a GIF of 10,000 frames costs one).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass

from localllm.errors import InputError
from localllm.util.user_file import read_user_file

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_PIXELS = 50_000_000  # a 48 MP phone photo (8000 x 6000) passes; its RGB is 150 MB. Pillow's own MAX_IMAGE_PIXELS is ~89 M
MAX_BYTES = 64 * 1024 * 1024  # a file; PNG at its worst is ~3 bytes a pixel, so MAX_PIXELS fits
MAX_SIDE = 32768  # larger than any camera; also bounds a header's absurd width with a small height


@dataclass(frozen=True)
class RGBImage:
    """A decoded picture: ``rgb`` is width * height * 3 bytes, row-major."""

    name: str  # the file name, for chips and messages
    width: int
    height: int
    rgb: bytes
    file_bytes: int
    sha256: str  # of the RGB pixels: the same picture is the same image to the cache, whatever its file

    @property
    def label(self) -> str:
        return f"{self.name} ({self.width}x{self.height})"


def load_image(path: str | os.PathLike[str], *, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_BYTES) -> RGBImage:
    """Read ``path`` as an RGB image, or raise ``InputError`` with one line naming
    the file and the cause."""
    p, data = read_user_file(path, kind="image", give="a picture file", max_bytes=max_bytes, limit_for="a picture")
    name = p.name or str(p)
    if not data:
        raise InputError(f"image {p} is empty")
    return decode_image(data, name=name, max_pixels=max_pixels, max_bytes=max_bytes)


def decode_image(data: bytes, *, name: str = "image", max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_BYTES) -> RGBImage:
    """``data`` (a whole picture file, e.g. serve's base64 payload) as RGB;
    ``InputError`` with one line naming ``name`` and the cause."""
    import io

    from PIL import Image  # lazy: Pillow costs ~40 ms to import and only images need it

    if len(data) > max_bytes:
        raise InputError(f"image {name} is {len(data) / 2**20:.0f} MiB, over the {max_bytes // 2**20} MiB limit for a picture")
    head = data[:512].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")) or b"<svg" in head:
        raise InputError(f"image {name} is an SVG (a vector drawing): export it as PNG first")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=list(FORMATS))  # reads the header only
    except Image.UnidentifiedImageError:
        raise InputError(f"image {name} is not a picture this tool reads ({', '.join(f.lower() for f in FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(f"image {name} claims more pixels than Pillow allows (a decompression bomb?)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"image {name} is damaged ({exc})") from None
    with im:
        w, h = im.size
        if w <= 0 or h <= 0:
            raise InputError(f"image {name} has no pixels ({w}x{h})")
        if w > MAX_SIDE or h > MAX_SIDE:  # the limit hit is named (a 60000x1 strip is 0 MP, not over the pixel limit)
            raise InputError(f"image {name} is {w}x{h}, a side over the {MAX_SIDE} pixel limit: scale it down first")
        if w * h > max_pixels:
            raise InputError(f"image {name} is {w}x{h} ({w * h / 1e6:.0f} MP), over the {max_pixels / 1e6:.0f} MP limit: scale it down first")
        try:
            im.seek(0)  # the first frame of a GIF or an animated WebP; later ones are never read
            rgb = _to_rgb(im)
            pixels = rgb.tobytes()
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise InputError(f"image {name} is truncated or damaged ({exc})") from None
        except MemoryError:
            raise InputError(f"image {name} is too large to decode here") from None
    if len(pixels) != w * h * 3:
        raise InputError(f"image {name} decoded to {len(pixels)} bytes, not {w}x{h} RGB")
    return RGBImage(name=name, width=w, height=h, rgb=pixels, file_bytes=len(data), sha256=hashlib.sha256(pixels).hexdigest())


def _to_rgb(im):
    """RGB pixels; a transparent picture is put on white (as a browser shows it), not on black."""
    from PIL import Image  # lazy: as in decode_image

    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        bg.alpha_composite(rgba)
        return bg.convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")  # no second copy of an RGB picture
