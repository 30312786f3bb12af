"""Read and validate GGUF headers without loading the model.

Why not ``gguf.GGUFReader``: it builds a numpy view for every array item, which
took 4.8 s on SmolLM2's 49k-token vocabulary here (and grows with Gemma's 262k).
This reader walks the header with ``struct`` and skips array payloads, so
``inspect`` and the pre-load validation take milliseconds. The type tables (value
types, quantization block sizes, file types) come from the ``gguf`` package, and
a test checks this reader against ``GGUFReader`` field by field.

Validation happens here, before llama.cpp sees a file: llama.cpp may abort or
crash on a truncated or malformed file, and its messages go to the log, not to
the user.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from localllm.errors import InputError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# Arrays longer than this are summarized (length only), except numeric arrays
# that describe layers, which stay short anyway. Vocabularies are 32k-262k long.
_MAX_KEPT_ARRAY = 4096


@dataclass(frozen=True)
class ArrayInfo:
    """A long array whose payload was skipped: only its element type and length."""

    item_type: GGUFValueType
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # absolute offset in the file

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return self.n_elements // block * size


@dataclass
class GGUFHeader:
    """Metadata and tensor table of a GGUF file."""

    path: Path
    version: int
    size_bytes: int
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0
    header_end: int = 0  # where the tensor table ends, before the padding up to data_offset

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", "unknown"))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.fields.get(f"{self.architecture}.{suffix}", default)


class _Cursor:
    def __init__(self, buf: memoryview, limit: int) -> None:
        self.buf = buf
        self.pos = 0
        self.limit = limit

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.limit:
            raise _Truncated

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.need(n)
        self.pos += n


class _Truncated(Exception):
    pass


def _read_value(cur: _Cursor, vtype: int) -> Any:
    vt = GGUFValueType(vtype)
    if vt in _SCALAR:
        return cur.unpack(_SCALAR[vt])
    if vt == GGUFValueType.STRING:
        return cur.string()
    if vt == GGUFValueType.ARRAY:
        item = GGUFValueType(cur.unpack("<I"))
        length = cur.unpack("<Q")
        if length > _MAX_KEPT_ARRAY:
            if item == GGUFValueType.STRING:
                for _ in range(length):
                    cur.skip_string()
            elif item in _SCALAR:
                nbytes = struct.calcsize(_SCALAR[item]) * length
                cur.need(nbytes)
                cur.pos += nbytes
            else:
                raise ValueError("nested arrays are not supported")
            return ArrayInfo(item, length)
        return [_read_value(cur, item) for _ in range(length)]
    raise ValueError(f"unknown value type {vtype}")


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and validate a GGUF file's header and tensor table.

    Raises ``InputError`` with one line saying what is wrong: missing, a
    directory, not GGUF, unsupported version, malformed, or truncated (the file
    is shorter than its tensor table says).
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"model file not found: {p}")
    if p.is_dir():
        raise InputError(f"{p} is a directory, not a GGUF file")
    size = p.stat().st_size
    if size < 24:
        raise InputError(f"{p} is not a GGUF file (only {size} bytes)")
    try:
        with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return _parse(p, view, size)
            finally:
                view.release()  # or the mmap cannot close while an exception holds the view
    except _Truncated:
        raise InputError(f"{p} is a truncated GGUF file (header ends early): re-download or re-convert it") from None
    except InputError:
        raise
    except (ValueError, UnicodeDecodeError, OverflowError, struct.error) as exc:
        raise InputError(f"{p} is not a valid GGUF file ({exc})") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None


def parse_prefix(label: str, buf: bytes, file_size: int) -> GGUFHeader | None:
    """Parse a header from the first bytes of a file (a ranged download); None
    when ``buf`` ends before the tensor table does (fetch more and try again)."""
    try:
        return _parse(Path(label), memoryview(buf), file_size, limit=len(buf))
    except _Truncated:
        return None
    except (ValueError, UnicodeDecodeError, OverflowError, struct.error) as exc:
        raise InputError(f"{label} is not a valid GGUF file ({exc})") from None


def _parse(p: Path, buf: memoryview, size: int, limit: int | None = None) -> GGUFHeader:
    try:
        cur = _Cursor(buf, size if limit is None else min(limit, size))
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise InputError(f"{p} is not a GGUF file (bad magic); localllm runs GGUF models only")
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise InputError(f"{p} has GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ValueError("implausible tensor or key count")
        header = GGUFHeader(path=p, version=version, size_bytes=size)
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            header.fields[key] = _read_value(cur, vtype)
        tensors: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
            ttype = cur.unpack("<I")
            offset = cur.unpack("<Q")
            tensors.append((name, shape, ttype, offset))
        align = int(header.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise ValueError(f"bad alignment {align}")
        data_offset = (cur.pos + align - 1) // align * align
        header.data_offset = data_offset
        header.header_end = cur.pos
        for name, shape, ttype, offset in tensors:
            try:
                qtype = GGMLQuantizationType(ttype)
            except ValueError:
                raise InputError(f"{p}: tensor {name} has unknown type {ttype}; this GGUF needs a newer localllm") from None
            header.tensors.append(TensorInfo(name, shape, qtype, data_offset + offset))
    except _Truncated:
        raise
    end = max((t.offset + t.n_bytes for t in header.tensors), default=header.data_offset)
    if end > size:
        missing = end - size
        raise InputError(
            f"{p} is a truncated GGUF file ({size} bytes, its tensor table needs {end}; "
            f"{missing} bytes missing): re-download or re-convert it"
        )
    return header
