"""Picture files into RGB, and the bad ones refused in one line before a pixel is decoded (vision.image)."""

from __future__ import annotations

import io
import os
import struct
import time
import tracemalloc
import zlib

import pytest
from PIL import Image

from localllm.errors import InputError
from localllm.vision.image import decode_image, load_image


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_claiming(w: int, h: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``w`` x ``h`` RGB pixels (a decompression bomb's shape)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb_of_its_size(fmt: str) -> None:
    im = Image.new("RGB", (7, 5), (200, 30, 40))
    got = decode_image(_save(im, fmt), name=f"x.{fmt.lower()}")
    assert (got.width, got.height) == (7, 5)
    assert len(got.rgb) == 7 * 5 * 3
    r, g, b = got.rgb[0], got.rgb[1], got.rgb[2]
    assert abs(r - 200) < 40 and g < 90 and b < 90  # lossy formats and GIF's palette move colours a little


def test_transparency_is_put_on_white() -> None:
    im = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert decode_image(_save(im, "PNG")).rgb[:3] == b"\xff\xff\xff"


def test_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = _save(frames[0], "GIF", save_all=True, append_images=frames[1:])
    got = decode_image(data)
    assert got.rgb[0] > 200 and got.rgb[2] < 50


def test_same_pixels_same_id_whatever_the_file() -> None:
    im = Image.new("RGB", (3, 3), (1, 2, 3))
    assert decode_image(_save(im, "PNG")).sha256 == decode_image(_save(im, "WEBP", lossless=True)).sha256
    assert decode_image(_save(im, "PNG")).sha256 != decode_image(_save(Image.new("RGB", (3, 3), (1, 2, 4)), "PNG")).sha256


def test_truncated_png_is_one_line() -> None:
    im = Image.effect_noise((64, 64), 50).convert("RGB")
    data = _save(im, "PNG")
    with pytest.raises(InputError, match="cut.png is (truncated or damaged|damaged)"):
        decode_image(data[: len(data) // 2], name="cut.png")


def test_30000_square_png_is_refused_from_its_header_without_decoding() -> None:
    data = _png_claiming(30000, 30000)
    assert len(data) < 200
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="big.png") as exc:
        decode_image(data, name="big.png")
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "\n" not in str(exc.value)
    assert took < 1 and peak < 20 * 2**20  # 30000^2 RGB would be 2.7 GB


def test_over_our_pixel_limit_but_under_pillows_is_refused_too() -> None:
    with pytest.raises(InputError, match=r"9000x9000 \(81 MP\), over the 50 MP limit"):
        decode_image(_png_claiming(9000, 9000), name="a.png")


def test_a_side_over_the_limit_is_named_as_such_not_as_megapixels() -> None:
    """Issue 64 item 4: a 60000x1 strip was refused as "0 MP, over the 50 MP limit"."""
    with pytest.raises(InputError, match=r"60000x1, a side over the 32768 pixel limit"):
        decode_image(_png_claiming(60000, 1), name="strip.png")


def test_gif_of_10000_frames_reads_only_the_first() -> None:
    # GIF89a, a 1x1 screen with a 2-colour table, then 10,000 frames of one pixel (the classic 1x1 LZW block)
    head = b"GIF89a" + struct.pack("<HH", 1, 1) + b"\x80\x00\x00" + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x21\xf9\x04\x00\x01\x00\x00\x00" + b"\x2c" + struct.pack("<HHHH", 0, 0, 1, 1) + b"\x00" + b"\x02\x02\x44\x01\x00"
    data = head + frame * 10000 + b"\x3b"
    t0 = time.perf_counter()
    got = decode_image(data, name="many.gif")
    assert time.perf_counter() - t0 < 1
    assert (got.width, got.height) == (1, 1)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 0) == 10000  # the file really holds them


def test_svg_is_refused_by_name(tmp_path) -> None:
    p = tmp_path / "d.svg"
    p.write_text('<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
    with pytest.raises(InputError, match="d.svg is an SVG"):
        load_image(p)


def test_fifo_is_never_opened(tmp_path) -> None:
    p = tmp_path / "pipe"
    os.mkfifo(p)
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="not a regular file"):
        load_image(p)
    assert time.perf_counter() - t0 < 1  # opening it would block for ever: no writer


def test_missing_folder_empty_and_oversized(tmp_path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(InputError, match="is a folder"):
        load_image(tmp_path)
    (tmp_path / "e.png").write_bytes(b"")
    with pytest.raises(InputError, match="is empty"):
        load_image(tmp_path / "e.png")
    (tmp_path / "b.png").write_bytes(_save(Image.new("RGB", (8, 8)), "PNG"))
    with pytest.raises(InputError, match="over the 0 MiB limit"):
        load_image(tmp_path / "b.png", max_bytes=10)


def test_not_an_image_is_named(tmp_path) -> None:
    p = tmp_path / "notes.png"
    p.write_text("hello, I am text")
    with pytest.raises(InputError, match="notes.png is not a picture this tool reads"):
        load_image(p)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: no path is out of its reach")
def test_path_outside_reach(tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.png").write_bytes(_save(Image.new("RGB", (2, 2)), "PNG"))
    locked.chmod(0)
    try:
        with pytest.raises(InputError, match="permission denied"):
            load_image(locked / "a.png")
    finally:
        locked.chmod(0o700)
