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

import collections
import mmap
import os
import re
import struct
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localllm.errors import InputError
from localllm.modelfile.gguf_names import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

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
    part: int = 0  # of a split model: the file (0: the first) the offset is in

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
    # GGUF value type of each key, and the item type for arrays (None otherwise):
    # ``check_bounds`` needs them, since Python values lose the width and sign.
    types: dict[str, tuple[int, int | None]] = field(default_factory=dict)

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
        if item == GGUFValueType.ARRAY:
            raise ValueError("nested arrays are not supported")  # nor by llama.cpp's gguf.cpp
        length = cur.unpack("<Q")
        if length > _MAX_KEPT_ARRAY:
            if item == GGUFValueType.STRING:
                _skip_strings(cur, length)
            elif item in _SCALAR:
                nbytes = struct.calcsize(_SCALAR[item]) * length
                cur.need(nbytes)
                cur.pos += nbytes
            else:
                raise ValueError("nested arrays are not supported")
            return ArrayInfo(item, length)
        return [_read_value(cur, item) for _ in range(length)]
    raise ValueError(f"unknown value type {vtype}")


_U64 = struct.Struct("<Q")


def _skip_strings(cur: _Cursor, count: int) -> None:
    """Past ``count`` strings (a vocabulary: Gemma 3's 262,144 tokens), in one
    tight loop: ``skip_string`` per token took 0.2 s of a header's 0.25."""
    buf, pos, limit, unpack = cur.buf, cur.pos, cur.limit, _U64.unpack_from
    for _ in range(count):
        if pos + 8 > limit:
            raise _Truncated
        pos += 8 + unpack(buf, pos)[0]
        if pos > limit:
            raise _Truncated
    cur.pos = pos


_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def split_parts(path: Path, count: int) -> list[Path]:
    """The files of a model split in ``count`` (llama.cpp's ``llama_split_path``:
    ``PREFIX-00001-of-0000N.gguf``), the first being ``path``."""
    m = _SPLIT_NAME.match(path.name)
    if m is None:
        raise InputError(f"{path} is the first of {count} parts, but its name is not PREFIX-00001-of-{count:05d}.gguf: "
                         "llama.cpp finds the other parts by that name")
    return [path.with_name(f"{m.group(1)}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1)]


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and validate a GGUF file's header and tensor table; of a split
    model (``split.count`` > 1), the first part's header with every part's
    tensors and the parts' sizes summed, as llama.cpp loads it.

    Raises ``InputError`` with one line saying what is wrong: missing, a
    directory, not GGUF, unsupported version, malformed, or truncated (the file
    is shorter than its tensor table says), a part of a split model missing.
    """
    header = _read_one(Path(path))
    count = header.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return header
    if header.get("split.no", 0) != 0:
        raise InputError(f"{header.path} is part {header.get('split.no', 0) + 1} of a model split in {count}: "
                         "give the first part (…-00001-of-…)")
    for k, part in enumerate(split_parts(header.path, count)[1:], start=1):
        if not part.exists():
            raise InputError(f"{header.path.name} is split in {count} parts and part {k + 1} is missing: {part}")
        other = _read_one(part)
        header.tensors.extend(replace(t, part=k) for t in other.tensors)
        header.size_bytes += other.size_bytes
    return header


_READ: collections.OrderedDict[tuple[str, int, int, int], GGUFHeader] = collections.OrderedDict()
_READ_LOCK = threading.Lock()  # the router fits in threads, the cockpit reads in workers
_READ_KEEP = 4  # a 262k-token vocabulary is ~20 MB of Python strings: a few files, not every one ever read


def _read_one(path: Path) -> GGUFHeader:
    """``_parse_one``, kept per file version (path, size, mtime, inode): one load
    reads a header three times (its name, its fit, its load), and Gemma 3's
    vocabulary takes ~0.25 s to parse. Each caller gets its own copy of the
    header's tables (a split model's first part is extended in place)."""
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        return _parse_one(path)  # it says why, in one line
    with _READ_LOCK:
        header = _READ.get(key)
        if header is not None:
            _READ.move_to_end(key)
    if header is None:
        header = _parse_one(path)
        with _READ_LOCK:
            _READ[key] = header
            while len(_READ) > _READ_KEEP:
                _READ.popitem(last=False)
    return replace(header, fields=dict(header.fields), tensors=list(header.tensors), types=dict(header.types))


def _parse_one(path: Path) -> GGUFHeader:
    p = path
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
    except (ValueError, UnicodeDecodeError, OverflowError, struct.error, RecursionError, MemoryError) as exc:
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
            item = None
            if vtype == GGUFValueType.ARRAY:
                item = cur.unpack("<I")
                cur.pos -= 4
            if key in header.fields:
                raise ValueError(f"duplicate key {_short(key)}")
            header.fields[key] = _read_value(cur, vtype)
            header.types[key] = (vtype, item)
        tensors: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if n_dims > 4:  # GGML_MAX_DIMS
                raise ValueError(f"tensor {_short(name)} has {n_dims} dimensions (at most 4)")
            shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
            ttype = cur.unpack("<I")
            offset = cur.unpack("<Q")
            tensors.append((name, shape, ttype, offset))
        align = header.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in header.types and header.types["general.alignment"][0] != GGUFValueType.UINT32:
            raise ValueError("general.alignment is not a uint32")  # llama.cpp's gguf.cpp refuses it too
        if align <= 0 or align & (align - 1):
            raise ValueError(f"bad alignment {align}")
        data_offset = (cur.pos + align - 1) // align * align
        header.data_offset = data_offset
        header.header_end = cur.pos
        for name, shape, ttype, offset in tensors:
            try:
                qtype = GGMLQuantizationType(ttype)
            except ValueError:
                raise InputError(f"{p}: tensor {_short(name)} has unknown type {ttype}; this GGUF needs a newer localllm") from None
            if qtype not in GGML_QUANT_SIZES:
                raise InputError(f"{p}: tensor {_short(name)} has type {qtype.name}, which has no data layout") from None
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
    check_bounds(header)
    return header


# -- bounds ------------------------------------------------------------------------
#
# llama.cpp checks many header values with GGML_ASSERT, which aborts the process,
# and the planner builds per-layer lists from them: both must see sane values.
# The limits are llama.cpp's own where it has one (the file cited), else far
# above any published model.

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS, src/llama-hparams.h (asserted in llama-model.cpp load_hparams)
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS, src/llama-hparams.h
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME (64) less the terminating NUL, ggml/include/ggml.h
MAX_VOCAB = 1 << 24  # no tokenizer has more than ~262k tokens today
MAX_WIDTH = 1 << 20  # embedding or feed-forward width (the largest today are ~53k)
MAX_HEADS = 1 << 16
MAX_HEAD_DIM = 1 << 16
MAX_U32 = (1 << 32) - 1
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES, src/llama-model.cpp

_INT_TYPES = frozenset(
    {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16, GGUFValueType.UINT32,
     GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
)
# <arch>.KEY -> (upper bound, may be a per-layer array)
_ARCH_INTS: dict[str, tuple[int, bool]] = {
    "block_count": (MAX_LAYERS, False),
    "context_length": (MAX_U32, False),
    "embedding_length": (MAX_WIDTH, False),
    "feed_forward_length": (MAX_WIDTH * 4, True),
    "expert_feed_forward_length": (MAX_WIDTH * 4, True),
    "attention.head_count": (MAX_HEADS, True),
    "attention.head_count_kv": (MAX_HEADS, True),
    "attention.key_length": (MAX_HEAD_DIM, False),
    "attention.value_length": (MAX_HEAD_DIM, False),
    "attention.key_length_mla": (MAX_HEAD_DIM, False),
    "attention.value_length_mla": (MAX_HEAD_DIM, False),
    "attention.sliding_window": (MAX_U32, False),
    "attention.sliding_window_pattern": (MAX_LAYERS, True),
    "rope.dimension_count": (MAX_HEAD_DIM, False),
    "vocab_size": (MAX_VOCAB, False),
    "expert_count": (MAX_EXPERTS, False),
    "expert_used_count": (MAX_EXPERTS, True),
    "expert_group_count": (MAX_EXPERTS, False),
    "expert_group_used_count": (MAX_EXPERTS, False),
    "nextn_predict_layers": (MAX_LAYERS, False),
}
_TOKEN_IDS = ("bos", "eos", "unk", "sep", "pad", "eot", "eom", "mask")


def check_bounds(header: GGUFHeader) -> None:
    """Refuse header values that would crash llama.cpp or make per-layer work
    explode: counts out of range, per-layer arrays of the wrong length, values
    of the wrong type for the keys localllm and llama.cpp read, tensor names
    that are duplicated, too long or carry no layer number. One ``InputError``
    naming the file and the key."""
    p = header.path

    def bad(what: str) -> InputError:
        return InputError(f"{p}: {what}; the file is damaged or was written by a broken converter")

    arch = header.fields.get("general.architecture")
    if "general.architecture" in header.fields and not isinstance(arch, str):
        raise bad("general.architecture is not a string")
    if isinstance(arch, str) and not 0 < len(arch) <= 64:
        raise bad(f"general.architecture {_short(arch)} is not a name")
    for key in ("general.name", "tokenizer.chat_template", "tokenizer.ggml.model", "tokenizer.ggml.pre"):
        if key in header.fields and not isinstance(header.fields[key], str):
            raise bad(f"{key} is not a string")
    for key in ("general.file_type", "general.quantization_version"):
        if key in header.fields and header.types[key][0] not in _INT_TYPES:
            raise bad(f"{key} is not an integer")
    _check_vocab(header, bad)
    n_layer = None
    if isinstance(arch, str):
        values: dict[str, Any] = {}
        for suffix, (hi, per_layer) in _ARCH_INTS.items():
            key = f"{arch}.{suffix}"
            if key not in header.fields:
                continue
            vtype, item = header.types[key]
            value = header.fields[key]
            if vtype == GGUFValueType.ARRAY and per_layer:
                if item not in _INT_TYPES and not (item == GGUFValueType.BOOL and suffix == "attention.sliding_window_pattern"):
                    raise bad(f"{key} is an array of {_type_name(item)}, not of integers")
                if isinstance(value, ArrayInfo):
                    raise bad(f"{key} has {value.length} entries; llama.cpp allows at most {MAX_LAYERS} layers")
                values[suffix] = [int(v) for v in value]
            elif vtype in _INT_TYPES:
                values[suffix] = int(value)
            else:
                raise bad(f"{key} is {_type_name(vtype)}, not an integer")
            for v in values[suffix] if isinstance(values[suffix], list) else [values[suffix]]:
                if not 0 <= v <= hi:
                    raise bad(f"{key} is {v}, outside 0..{hi}")
        if "block_count" in values:
            n_layer = values["block_count"]
            if n_layer < 1:
                raise bad(f"{arch}.block_count is 0: a model needs at least one layer")
            for suffix, v in values.items():
                if isinstance(v, list) and len(v) != n_layer:
                    raise bad(f"{arch}.{suffix} has {len(v)} entries for {n_layer} layers")
            if values.get("nextn_predict_layers", 0) > n_layer:
                raise bad(f"{arch}.nextn_predict_layers ({values['nextn_predict_layers']}) exceeds the layer count ({n_layer})")
        _check_experts(arch, values, bad)
        scaling = header.fields.get(f"{arch}.rope.scaling.type")
        if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
            raise bad(f"{arch}.rope.scaling.type is {_short(scaling)}, not one of {', '.join(ROPE_SCALING_TYPES)}")
    _check_tensors(header, n_layer, bad)


def _short(name: str, limit: int = 60) -> str:
    """A name from the file, quoted and cut short for a one-line message: a
    damaged length field can make a "name" megabytes long."""
    return repr(name[:limit]) + ("..." if len(name) > limit else "")


def _type_name(vtype: int | None) -> str:
    if vtype is None:
        return "no type"
    try:
        return {GGUFValueType.STRING: "a string", GGUFValueType.ARRAY: "an array", GGUFValueType.BOOL: "a boolean",
                GGUFValueType.FLOAT32: "a float", GGUFValueType.FLOAT64: "a float"}.get(GGUFValueType(vtype), GGUFValueType(vtype).name.lower())
    except ValueError:
        return f"type {vtype}"


def _check_vocab(header: GGUFHeader, bad: Any) -> None:
    tokens = header.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    vtype, item = header.types["tokenizer.ggml.tokens"]
    if vtype != GGUFValueType.ARRAY or item != GGUFValueType.STRING:
        raise bad("tokenizer.ggml.tokens is not an array of strings")
    n = tokens.length if isinstance(tokens, ArrayInfo) else len(tokens)
    if not 1 <= n <= MAX_VOCAB:
        raise bad(f"the vocabulary has {n} tokens, outside 1..{MAX_VOCAB}")
    for key, items in (("tokenizer.ggml.scores", (GGUFValueType.FLOAT32, GGUFValueType.INT32)), ("tokenizer.ggml.token_type", (GGUFValueType.INT32,))):
        if key not in header.fields:
            continue
        vt, it = header.types[key]
        value = header.fields[key]
        if vt != GGUFValueType.ARRAY or it not in items:
            raise bad(f"{key} is not an array of {' or '.join(t.name.lower() for t in items)}")
        length = value.length if isinstance(value, ArrayInfo) else len(value)
        if length != n:
            raise bad(f"{key} has {length} entries for {n} tokens")
    for name in _TOKEN_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in header.fields:
            # Out of range is llama.cpp's to handle (it warns and uses its default).
            if header.types[key][0] not in _INT_TYPES:
                raise bad(f"{key} is not an integer")


def _check_experts(arch: str, v: dict[str, Any], bad: Any) -> None:
    """The mixture-of-experts invariants llama.cpp asserts (llama-model.cpp, load_hparams)."""
    n_expert = v.get("expert_count", 0)
    used = v.get("expert_used_count", 0)
    used_max = max(used) if isinstance(used, list) else used
    groups = v.get("expert_group_count", 0)
    if used_max > n_expert:
        raise bad(f"{arch}.expert_used_count ({used_max}) exceeds {arch}.expert_count ({n_expert})")
    if n_expert > 0:
        if used_max == 0:
            raise bad(f"{arch}.expert_count is {n_expert} but no expert is used per token")
        if groups >= n_expert:
            raise bad(f"{arch}.expert_group_count ({groups}) must be below {arch}.expert_count ({n_expert})")
        if groups > 1:
            group_used = v.get("expert_group_used_count", 0)
            if n_expert % groups or not 0 < group_used < groups:
                raise bad(f"{arch}: {n_expert} experts do not divide into {groups} groups with {group_used} used")
    elif groups:
        raise bad(f"{arch}.expert_group_count is {groups} without experts")


def _check_tensors(header: GGUFHeader, n_layer: int | None, bad: Any) -> None:
    seen: set[str] = set()
    for t in header.tensors:
        if t.name in seen:
            raise bad(f"tensor {_short(t.name)} appears twice")
        seen.add(t.name)
        if len(t.name.encode("utf-8", "surrogatepass")) > MAX_TENSOR_NAME:
            raise bad(f"tensor name {_short(t.name)} is longer than {MAX_TENSOR_NAME} bytes")
        if t.name.startswith("blk."):
            part = t.name.split(".")[1]
            if not part.isdigit() or not part.isascii():
                raise bad(f"tensor {_short(t.name)} has no layer number after 'blk.'")
            if n_layer is not None and int(part) >= n_layer:
                raise bad(f"tensor {_short(t.name)} is for layer {int(part)}, but the model has {n_layer} layers")
