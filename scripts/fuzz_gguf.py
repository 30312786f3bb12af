"""Fuzz localllm with damaged GGUF files: every case must end in one line.

Mutations of a synthetic GGUF (and of a real one, e.g. SmolLM2, with ``--real``):
every structural boundary truncated; counts and lengths (tensor and key counts,
string and array lengths, dimensions) set to 0, 1, 2^31 and 2^64-1; known keys
given absurd values and wrong types; non-UTF-8 strings and escape sequences in
names; tensors renamed, duplicated, or pointing past the end; per-layer arrays
of the wrong length. Each damaged file goes through ``inspect``, ``plan``,
``run`` and ``list`` (as a file in an LM Studio folder), each with a time limit.

A case passes when every command ends by itself within its limit, with exit 0
or 1 (never a signal), no traceback and no "internal error"; an exit 1 must be
one line on stderr naming the file. ``list`` must exit 0 and name the file.

    python -m scripts.fuzz_gguf                    # every case on the synthetic model
    python -m scripts.fuzz_gguf --sample 60 --seed 1 --real PATH
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# GGUF value types (gguf-py's GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
_INTS = (U8, I8, U16, I16, U32, I32, U64, I64)
BIG = (0, 1, 1 << 31, (1 << 64) - 1)


@dataclass
class KV:
    key: bytes
    vtype: int
    raw: bytes  # the encoded value (for arrays: item type, length, items)


@dataclass
class TI:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int


@dataclass
class Model:
    version: int
    kvs: list[KV]
    tis: list[TI]
    data: bytes  # the data section (after the aligned header)
    align: int = 32


@dataclass
class Layout:
    """Byte positions in the serialized file: boundaries to cut at, and
    (offset, width) of every count or length field."""

    boundaries: list[int] = field(default_factory=list)
    counts: list[tuple[int, int, str]] = field(default_factory=list)


# -- reading and writing -------------------------------------------------------------


def _string(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + n], pos + 8 + n


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _FMT:
        return pos + struct.calcsize(_FMT[vtype])
    if vtype == STR:
        return _string(buf, pos)[1]
    if vtype == ARR:
        item, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _FMT:
            return pos + n * struct.calcsize(_FMT[item])
        for _ in range(n):
            pos = _skip_value(buf, pos, item)
        return pos
    raise ValueError(vtype)


def parse(path: Path) -> Model:
    buf = path.read_bytes()
    version, n_t, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24
    kvs = []
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        end = _skip_value(buf, pos, vtype)
        kvs.append(KV(key, vtype, buf[pos:end]))
        pos = end
    tis = []
    for _ in range(n_t):
        name, pos = _string(buf, pos)
        (nd,) = struct.unpack_from("<I", buf, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", buf, pos + 4))
        pos += 4 + 8 * nd
        ttype, off = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        tis.append(TI(name, dims, ttype, off))
    align = 32
    for kv in kvs:
        if kv.key == b"general.alignment" and kv.vtype == U32:
            align = struct.unpack("<I", kv.raw)[0]
    start = (pos + align - 1) // align * align
    return Model(version, kvs, tis, buf[start:], align)


def serialize(m: Model, layout: Layout | None = None, n_tensors: int | None = None, n_kv: int | None = None) -> bytes:
    out = bytearray(b"GGUF")
    lay = layout or Layout()

    def mark() -> None:
        lay.boundaries.append(len(out))

    out += struct.pack("<I", m.version)
    mark()
    lay.counts.append((len(out), 8, "n_tensors"))
    out += struct.pack("<Q", len(m.tis) if n_tensors is None else n_tensors)
    mark()
    lay.counts.append((len(out), 8, "n_kv"))
    out += struct.pack("<Q", len(m.kvs) if n_kv is None else n_kv)
    mark()
    for kv in m.kvs:
        name = kv.key.decode("utf-8", "replace")
        lay.counts.append((len(out), 8, f"length of key {name}"))
        out += struct.pack("<Q", len(kv.key)) + kv.key
        mark()
        out += struct.pack("<I", kv.vtype)
        mark()
        if kv.vtype == STR:
            lay.counts.append((len(out), 8, f"length of the string {name}"))
        elif kv.vtype == ARR:
            lay.counts.append((len(out) + 4, 8, f"length of the array {name}"))
        out += kv.raw
        mark()
    for ti in m.tis:
        name = ti.name.decode("utf-8", "replace")
        lay.counts.append((len(out), 8, f"length of tensor name {name}"))
        out += struct.pack("<Q", len(ti.name)) + ti.name
        mark()
        lay.counts.append((len(out), 4, f"n_dims of {name}"))
        out += struct.pack("<I", len(ti.dims))
        for i, d in enumerate(ti.dims):
            lay.counts.append((len(out), 8, f"dim {i} of {name}"))
            out += struct.pack("<Q", d)
        mark()
        out += struct.pack("<IQ", ti.ttype, ti.offset)
        mark()
    pad = (len(out) + m.align - 1) // m.align * m.align - len(out)
    out += b"\0" * pad
    mark()
    out += m.data
    lay.boundaries.append(len(out) - 1)
    return bytes(out)


def enc(vtype: int, value: object) -> bytes:
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], value)
    if vtype == STR:
        raw = value if isinstance(value, bytes) else str(value).encode()
        return struct.pack("<Q", len(raw)) + raw
    raise ValueError(vtype)


def enc_array(item: int, values: list) -> bytes:
    return struct.pack("<IQ", item, len(values)) + b"".join(enc(item, v) for v in values)


# -- mutations -----------------------------------------------------------------------


@dataclass
class Case:
    name: str
    make: Callable[[], bytes]


def _replace_kv(m: Model, suffix: str, vtype: int, raw: bytes, add: bool = False) -> Model | None:
    kvs = []
    hit = False
    for kv in m.kvs:
        k = kv.key.decode("utf-8", "replace")
        if not hit and (k == suffix or k.endswith("." + suffix)):
            kvs.append(KV(kv.key, vtype, raw))
            hit = True
        else:
            kvs.append(kv)
    if not hit:
        if not add:
            return None
        arch = next((kv.raw[8:].decode() for kv in m.kvs if kv.key == b"general.architecture"), "llama")
        full = suffix if suffix.startswith(("general.", "tokenizer.")) else f"{arch}.{suffix}"
        kvs.append(KV(full.encode(), vtype, raw))
    return Model(m.version, kvs, m.tis, m.data, m.align)


def _n_layer(m: Model) -> int:
    for kv in m.kvs:
        if kv.key.endswith(b".block_count"):
            return struct.unpack(_FMT[kv.vtype], kv.raw)[0]
    return 1


def cases(base: Path, tag: str) -> list[Case]:
    m = parse(base)
    layout = Layout()
    original = serialize(m, layout)
    out: list[Case] = []
    n_layer = _n_layer(m)

    def add(name: str, make: Callable[[], bytes | None]) -> None:
        out.append(Case(f"{tag}: {name}", make))  # type: ignore[arg-type]

    # 1. every structural boundary, truncated
    for b in sorted(set(layout.boundaries)):
        add(f"truncated at byte {b}", lambda b=b: original[:b])
    # 2. every count and length set to 0, 1, 2^31, 2^64-1
    for pos, width, what in layout.counts:
        for v in BIG:
            v = v if width == 8 else min(v, (1 << 32) - 1)

            def make(pos: int = pos, width: int = width, v: int = v) -> bytes:
                b = bytearray(original)
                b[pos : pos + width] = v.to_bytes(width, "little")
                return bytes(b)

            add(f"{what} = {v}", make)
    # 3. known keys with absurd values, of their own type
    known_ints = (
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "rope.dimension_count",
        "vocab_size",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "general.alignment",
        "general.file_type",
        "expert_count",
        "expert_used_count",
        "attention.key_length",
        "attention.sliding_window",
    )
    for key in known_ints:
        for v in (0, 1, 1 << 31, (1 << 32) - 1, (1 << 64) - 1):
            vtype = U64 if v >= 1 << 32 else U32
            add(f"{key} = {v}", lambda key=key, v=v, vtype=vtype: _ser(_replace_kv(m, key, vtype, enc(vtype, v), add=True)))
    # 4. wrong types for known keys
    wrong = {
        "a string": (STR, enc(STR, "x")),
        "a float": (F32, enc(F32, 1.5)),
        "a bool": (BOOL, enc(BOOL, True)),
        "an int array": (ARR, enc_array(I32, [1, 2])),
        "a string array": (ARR, enc_array(STR, ["a"])),
        "an int64": (I64, enc(I64, -7)),
        "an empty array": (ARR, enc_array(U32, [])),
        "a float array": (ARR, enc_array(F32, [0.5] * n_layer)),
    }
    wrong_keys = (
        "general.architecture",
        "general.alignment",
        "general.name",
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "rope.dimension_count",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.chat_template",
        "tokenizer.ggml.model",
        "general.file_type",
        "attention.layer_norm_rms_eps",
        "rope.freq_base",
        "attention.sliding_window",
    )
    for key in wrong_keys:
        for what, (vtype, raw) in wrong.items():
            add(f"{key} as {what}", lambda key=key, vtype=vtype, raw=raw: _ser(_replace_kv(m, key, vtype, raw, add=True)))
    # 5. non-UTF-8 and escape sequences in strings
    for key in ("general.name", "general.architecture", "tokenizer.ggml.model", "tokenizer.chat_template"):
        for what, raw in (("non-UTF-8", b"\xff\xfe\x80bad"), ("escape sequences", b"evil\x1b[2J\nlocalllm: forged line")):
            add(f"{key} with {what}", lambda key=key, raw=raw: _ser(_replace_kv(m, key, STR, enc(STR, raw), add=True)))
    first_blk = next((i for i, t in enumerate(m.tis) if t.name.startswith(b"blk.")), 0)
    for what, name in (
        ("non-UTF-8", b"blk.0.\xff\xfe"),
        ("escape sequences", b"blk.0.\x1b]0;x\x07\n"),
        ("no layer number", b"blk.x.attn_q.weight"),
        ("layer 999", b"blk.999.attn_q.weight"),
        ("100 bytes long", b"blk.0." + b"a" * 94),
        ("empty", b""),
    ):
        add(f"tensor name {what}", lambda name=name: _ser(_with_tensor(m, first_blk, name=name)))
    # 6. tensors duplicated or past the end
    add("tensor duplicated", lambda: _ser(Model(m.version, m.kvs, m.tis + [m.tis[first_blk]], m.data, m.align)))
    add("tensor offset past the end", lambda: _ser(_with_tensor(m, len(m.tis) - 1, offset=len(m.data) + 4096)))
    add("tensor offset 2^63", lambda: _ser(_with_tensor(m, first_blk, offset=1 << 63)))
    add("tensor offset misaligned", lambda: _ser(_with_tensor(m, first_blk, offset=m.tis[first_blk].offset + 1)))
    add("tensor dim 2^40", lambda: _ser(_with_tensor(m, first_blk, dims=[1 << 40] + m.tis[first_blk].dims[1:])))
    add("tensor type 255", lambda: _ser(_with_tensor(m, first_blk, ttype=255)))
    add("tensor type 4 (removed Q4_2)", lambda: _ser(_with_tensor(m, first_blk, ttype=4)))
    add("tensor with 5 dimensions", lambda: _ser(_with_tensor(m, first_blk, dims=m.tis[first_blk].dims + [1, 1, 1])))
    add("tensor table emptied", lambda: _ser(Model(m.version, m.kvs, [], m.data, m.align)))
    # 7. per-layer arrays and invariants
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        for n in (max(n_layer - 1, 0), n_layer + 1, 1 << 20):
            vals = [4] * min(n, 4096)
            raw = enc_array(U32, vals) if n < 1 << 20 else struct.pack("<IQ", U32, n) + b""
            add(f"{key} as an array of {n}", lambda key=key, raw=raw: _ser(_replace_kv(m, key, ARR, raw, add=True)))
    add("head_count 0 in one layer", lambda: _ser(_replace_kv(m, "attention.head_count", ARR, enc_array(U32, [0] + [4] * (n_layer - 1)))))
    add("expert_count 8 with none used", lambda: _ser(_replace_kv(m, "expert_count", U32, enc(U32, 8), add=True)))
    add("expert_used_count 2 without experts", lambda: _ser(_replace_kv(m, "expert_used_count", U32, enc(U32, 2), add=True)))
    add(
        "expert_count 2048",
        lambda: _ser(_replace_kv(_replace_kv(m, "expert_count", U32, enc(U32, 2048), add=True), "expert_used_count", U32, enc(U32, 2), add=True)),
    )
    add("rope.scaling.type bogus", lambda: _ser(_replace_kv(m, "rope.scaling.type", STR, enc(STR, "bogus"), add=True)))
    add("nextn_predict_layers past the layers", lambda: _ser(_replace_kv(m, "nextn_predict_layers", U32, enc(U32, n_layer + 5), add=True)))
    add("key duplicated", lambda: _ser(Model(m.version, m.kvs + [m.kvs[1]], m.tis, m.data, m.align)))
    add("version 1", lambda: _ser(Model(1, m.kvs, m.tis, m.data, m.align)))
    add(
        "chat template that loops",
        lambda: _ser(
            _replace_kv(
                m, "tokenizer.chat_template", STR, enc(STR, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), add=True
            )
        ),
    )
    add("chat template that explodes", lambda: _ser(_replace_kv(m, "tokenizer.chat_template", STR, enc(STR, "{{ 'x' * 10 ** 10 }}"), add=True)))
    add("chat template that errors", lambda: _ser(_replace_kv(m, "tokenizer.chat_template", STR, enc(STR, "{{ raise_exception('no') }}"), add=True)))
    add("chat template syntax error", lambda: _ser(_replace_kv(m, "tokenizer.chat_template", STR, enc(STR, "{% for %}"), add=True)))
    return out


def _ser(m: Model | None) -> bytes | None:
    return None if m is None else serialize(m)


def _with_tensor(m: Model, i: int, **change: object) -> Model:
    tis = list(m.tis)
    t = tis[i]
    tis[i] = TI(change.get("name", t.name), change.get("dims", t.dims), change.get("ttype", t.ttype), change.get("offset", t.offset))  # type: ignore[arg-type]
    return Model(m.version, m.kvs, tis, m.data, m.align)


# -- running -------------------------------------------------------------------------


@dataclass
class Result:
    case: str
    ok: bool
    problems: list[str]
    seconds: float


COMMANDS = {
    "inspect": (["inspect", "{f}"], 30),
    "plan": (["plan", "{f}"], 30),
    "run": (["run", "{f}", "-p", "hi", "-n", "2", "--temp", "0", "--ctx", "256"], 60),
    "list": (["list"], 30),
}


def run_case(case: Case, workdir: Path) -> Result | None:
    data = case.make()
    if data is None:
        return None  # the mutation does not apply to this model
    t0 = time.perf_counter()
    d = Path(tempfile.mkdtemp(dir=workdir))
    models = d / "lmstudio"
    models.mkdir()
    f = models / "model.gguf"
    f.write_bytes(data)
    env = {
        **os.environ,
        "LOCALLLM_HOME": str(d / "home"),
        "LOCALLLM_LMSTUDIO_DIR": str(models),
        "HF_HOME": str(d / "hf"),
        "OLLAMA_MODELS": str(d / "ollama"),
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }
    problems: list[str] = []
    for cmd, (argv, limit) in COMMANDS.items():
        args = [a.replace("{f}", str(f)) for a in argv]
        if cmd == "run":
            args.append("--raw" if "template" not in case.name else "--no-stats")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "localllm", *args],
                capture_output=True,
                text=True,
                errors="replace",
                env=env,
                cwd=REPO,
                timeout=limit,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            problems.append(f"{cmd}: no answer within {limit} s")
            continue
        err = proc.stderr
        lines = [x for x in err.splitlines() if x.strip()]
        if proc.returncode < 0 or proc.returncode > 2:
            problems.append(f"{cmd}: exit {proc.returncode} (signal or crash): {err[-300:]!r}")
        elif "Traceback" in err or "internal error" in err:
            problems.append(f"{cmd}: {err[-300:]!r}")
        elif cmd == "list":
            if proc.returncode != 0 or "model.gguf" not in proc.stdout:
                problems.append(f"list: exit {proc.returncode}, {proc.stdout[-200:]!r} {err[-200:]!r}")
        elif proc.returncode == 1:
            if len([x for x in lines if x.startswith("localllm: error:")]) != 1 or len(lines) != 1:
                problems.append(f"{cmd}: not one line: {err[-300:]!r}")
            elif "model.gguf" not in lines[0] and "does not fit" not in lines[0]:
                problems.append(f"{cmd}: the error does not name the file: {lines[0]!r}")
        elif proc.returncode == 2:
            problems.append(f"{cmd}: usage error for a bad file: {err[-200:]!r}")
    return Result(case.name, not problems, problems, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="append", default=[], metavar="PATH", help="also mutate this real GGUF (repeatable)")
    ap.add_argument("--no-synthetic", action="store_true", help="only the --real files")
    ap.add_argument("--sample", type=int, default=0, help="run this many cases, drawn with --seed (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--match", default=None, help="only cases whose name contains this")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every result here")
    a = ap.parse_args(argv)
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-") as tmp:
        work = Path(tmp)
        synth = write_llama_gguf(work / "synth.gguf", SynthSpec(n_layer=2, n_embd=64, n_head=4, n_head_kv=2))
        all_cases = [] if a.no_synthetic else cases(synth, "synthetic")
        for real in a.real:
            all_cases += cases(Path(real), Path(real).name)
        if a.match:
            all_cases = [c for c in all_cases if a.match in c.name]
        chosen = random.Random(a.seed).sample(all_cases, a.sample) if a.sample and a.sample < len(all_cases) else all_cases
        print(f"fuzz: {len(chosen)} of {len(all_cases)} cases", file=sys.stderr, flush=True)
        results: list[Result] = []
        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.jobs) as pool:
            futures = [pool.submit(run_case, c, work) for c in chosen]
            for fut in as_completed(futures):
                r = fut.result()
                if r is None:
                    continue
                results.append(r)
                failed_now = sum(not x.ok for x in results)
                print(
                    f"{'ok  ' if r.ok else 'FAIL'} [{len(results)} ran, {failed_now} failed] {r.case} ({r.seconds:.1f} s)"
                    + ("" if r.ok else ": " + " | ".join(r.problems)),
                    flush=True,
                )
        failed = [r for r in results if not r.ok]
        print(
            f"fuzz: {len(results)} cases ran ({len(results) * len(COMMANDS)} commands), {len(results) - len(failed)} passed, "
            f"{len(failed)} failed, in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        if a.json:
            Path(a.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
