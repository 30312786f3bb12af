"""The quantization pipeline behind ``localllm quantize``.

llama.cpp does the quantizing (``engine.quantize_model``). This module makes it
safe and visible:

- it runs in a child process (``quantize.worker``), so Ctrl+C stops it at once
  (a C call cannot be interrupted from Python) and the parent cleans up;
- it writes to a hidden temporary file in the target directory and renames it
  only on success: an interrupted or failed run leaves nothing under the
  output name, and the input is never touched;
- it checks free disk space against the dry-run size first;
- it turns llama.cpp's per-tensor log lines into progress events, for the CLI's
  bar and the TUI alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localllm.errors import InputError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.modelfile.model_info import TensorTypeStat, describe
from localllm.plan.planner import row_bytes
from localllm.util import atomic
from localllm.util.units import format_size

TYPES = (
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_0",
    "Q5_1",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_0",
    "Q4_1",
    "IQ4_NL",
    "IQ4_XS",
    "Q3_K_M",
    "Q3_K_S",
    "Q2_K",
    "F16",
    "BF16",
    "F32",
)
SOURCE_TYPES = ("F32", "F16", "BF16")
_PROGRESS = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_SIZE = re.compile(r"(model|quant) size\s+=\s+([\d.]+) MiB")
# a dry run's tensor line ends "size = 54.00 MiB -> 28.69 MiB (q8_0)" when the type changes
_NEW_TYPE = re.compile(r"->\s+[\d.]+ MiB \((\w+)\)\s*$")


@dataclass(frozen=True)
class Progress:
    """One tensor written (``index`` of ``total``)."""

    index: int
    total: int
    tensor: str


@dataclass
class Report:
    input: str
    output: str | None
    type: str
    input_bytes: int
    output_bytes: int
    bits_per_weight: float
    seconds: float
    dry_run: bool
    tensor_types: list[TensorTypeStat] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Job:
    src: Path
    dst: Path
    qtype: str
    threads: int = 0
    allow_requantize: bool = False
    force: bool = False
    imatrix: Path | None = None

    def check(self, *, probe_write: bool = True) -> None:
        """Refuse before any work: bad type, bad input, unsafe output. ``probe_write``
        makes (and deletes) a file in the output folder: not for a dry run, which
        writes nothing."""
        if self.qtype not in TYPES:
            raise UsageError(f"unknown quantization type '{self.qtype}': choose one of {', '.join(TYPES)}")
        info = describe(read_header(self.src))
        if info.file_type not in SOURCE_TYPES and not self.allow_requantize:
            raise UsageError(
                f"{self.src.name} is already quantized ({info.file_type}); quantizing it again loses more quality: "
                "start from an F16/BF16/F32 file, or pass --allow-requantize"
            )
        if self.dst.resolve() == self.src.resolve():
            raise UsageError("the output would overwrite the input: name another output file")
        kind = _not_a_regular_file(self.dst)
        if kind:
            # replacing it would swap a device, a pipe or a link for a file (as root, /dev/null itself)
            raise UsageError(f"{self.dst} is {kind}, not a regular file: name a new file, or a regular file to replace with --force")
        if self.dst.exists() and not self.force:
            raise UsageError(f"{self.dst} exists: pass --force to replace it")
        parent = self.dst.parent
        if not parent.is_dir():
            raise UsageError(f"the output directory {parent} {'is not a directory' if parent.exists() else 'does not exist'}")
        if probe_write:
            _check_writable(parent)


def _check_writable(folder: Path) -> None:
    """Create and delete a file in ``folder``, as llama.cpp's writer will: refused
    (a read-only folder or file system), it is one line naming the folder and the
    OS's reason, not llama.cpp's "basic_ios::clear: iostream error" after the
    source is read. A probe, not os.access: that says yes to root on a read-only
    mount."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".localllm-write-check-")
    except OSError as exc:
        raise InputError(f"cannot write to {folder}: {exc.strerror or exc}: name an output file in a folder you can write to") from None
    os.close(fd)
    os.unlink(name)


def _not_a_regular_file(path: Path) -> str:
    """What ``path`` is when it exists and is not a regular file ("a directory",
    "a symbolic link", "a device", "a FIFO", "a socket"); "" for a regular file
    or a new path. A link is not followed: replacing it would not write its target."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new path (or one under a file: the folder check names it)
        return ""
    for test, kind in ((stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _run_child(job: Job, dst: Path, dry: bool, tensor_lines: bool = False) -> Iterator[Progress | tuple]:
    """Run ``python -m quantize.worker`` and turn its log lines into events. The
    child gets its own session, so Ctrl+C reaches only us; we then kill it."""
    args = {
        "parent": os.getpid(),
        "src": str(job.src.resolve()),
        "dst": str(dst.resolve()),
        "type": job.qtype,
        "threads": job.threads,
        "allow_requantize": job.allow_requantize,
        "dry_run": dry,
        "imatrix": str(job.imatrix.resolve()) if job.imatrix else None,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "localllm.quantize.worker", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    done = False
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            kind, payload = json.loads(raw)
            if kind == "done":
                done = True
                break
            if kind == "error":
                raise InputError(payload)
            m = _PROGRESS.match(payload)
            if m:
                yield Progress(int(m.group(1)), int(m.group(2)), m.group(3))
                t = _NEW_TYPE.search(payload) if tensor_lines else None
                if t:
                    yield ("tensor", m.group(3), t.group(1))
            s = _SIZE.search(payload)
            if s:
                yield (s.group(1), float(s.group(2)))
        if not done:
            proc.wait()
            raise InputError(f"the quantizer stopped unexpectedly (exit code {proc.returncode})")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def dry_run_size(job: Job) -> int:
    """The size of the file llama.cpp will write, in bytes, without writing it.

    llama.cpp's dry run prints each tensor's new type (``... -> 0.12 MiB (q4_K)``)
    and a total of tensor data in MiB to two decimals; the file also holds the
    metadata, the tensor table and alignment padding (3.5% of a small file). So
    the size is rebuilt from llama.cpp's per-tensor choices and the GGUF layout
    (src/llama-quant.cpp writes the source's key/values, general.file_type and
    general.quantization_version, then each tensor padded to the alignment)."""
    return predicted_sizes(job)[0]


def predicted_sizes(job: Job) -> tuple[int, int]:
    """(file bytes, tensor data bytes) of the output, from a dry run."""
    new_types: dict[str, str] = {}
    for event in _run_child(job, job.dst.with_name(job.dst.name + ".dryrun"), dry=True, tensor_lines=True):
        if isinstance(event, tuple) and event[0] == "tensor":
            new_types[event[1]] = event[2]
    return predicted_file_size(read_header(job.src), new_types)


def predicted_file_size(src: GGUFHeader, new_types: dict[str, str]) -> tuple[int, int]:
    """(file bytes, tensor data bytes) when ``src``'s tensors take ``new_types``
    (name -> ggml type name; a tensor not named keeps its type)."""

    align = int(src.get("general.alignment", 32))
    pad = lambda n: (n + align - 1) // align * align  # noqa: E731
    added = 0
    for key in ("general.quantization_version", "general.file_type"):
        if key not in src.fields:
            added += 8 + len(key) + 4 + 4  # key (u64 length + bytes), value type (u32), u32 value
    for key, value_bytes in (("split.no", 2), ("split.count", 2), ("split.tensors.count", 4)):
        if key in src.fields:  # removed from the output
            added -= 8 + len(key) + 4 + value_bytes
    data = raw = 0
    for t in src.tensors:
        name = new_types.get(t.name)
        if name is None:
            nbytes = t.n_bytes
        else:
            ne0 = t.shape[0] if t.shape else 1
            nbytes = (t.n_elements // ne0) * row_bytes(name, ne0)
        data += pad(nbytes)
        raw += nbytes
    return pad(src.header_end + added) + data, raw


def run(job: Job) -> Iterator[Progress | Report]:
    """Quantize ``job.src`` into ``job.dst``; yields progress, then the report."""
    job.check()
    t0 = time.perf_counter()
    need = dry_run_size(job)
    free = shutil.disk_usage(job.dst.parent).free
    header_room = 64 * 1024 * 1024
    if need + header_room > free:
        raise InputError(f"needs {format_size(need + header_room, 'GiB')} free in {job.dst.parent} (the file's {format_size(need, 'GiB')} "
                         f"and a {format_size(header_room, 'MiB')} margin), only {format_size(free, 'GiB')}: free some space or write elsewhere")
    remove_stale_partials(job.dst.parent)
    # llama.cpp writes ``.<name>.partial-<pid>`` (the name remove_stale_partials
    # knows); it takes the output's name only when complete.
    with atomic.replacing(job.dst, tmp_name=f".{job.dst.name}.partial-{os.getpid()}") as tmp:
        for event in _run_child(job, tmp, dry=False):
            if isinstance(event, Progress):
                yield event
    yield report(job.src, job.dst, job.qtype, time.perf_counter() - t0)


_PARTIAL = re.compile(r"^\..+\.partial-(\d+)$")


def remove_stale_partials(folder: Path) -> list[Path]:
    """Delete ``.<name>.partial-<pid>`` files whose process is gone: what a
    quantize killed with SIGKILL (or a power cut) left. A live process's file is
    kept. Returns what was removed."""
    import psutil

    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _PARTIAL.match(p.name)
        if not m or not p.is_file():
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and psutil.pid_exists(pid):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def report(src: Path, dst: Path, qtype: str, seconds: float) -> Report:
    out = describe(read_header(dst))
    return Report(
        input=str(src),
        output=str(dst),
        type=qtype,
        input_bytes=src.stat().st_size,
        output_bytes=dst.stat().st_size,
        bits_per_weight=out.bits_per_weight,
        seconds=seconds,
        dry_run=False,
        tensor_types=out.tensor_types,
    )


def dry_report(job: Job) -> Report:
    job.check(probe_write=False)
    t0 = time.perf_counter()
    size, data = predicted_sizes(job)
    n_params = describe(read_header(job.src)).n_params  # bits per weight: of the tensor data, as llama.cpp counts it
    bpw = round(data * 8 / n_params, 4) if n_params else 0.0
    # output: the path it would write (nothing is written; dry_run says so)
    return Report(str(job.src), str(job.dst), job.qtype, job.src.stat().st_size, size, bpw, time.perf_counter() - t0, True, [])
