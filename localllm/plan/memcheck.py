"""Every load checks the plan: llama.cpp's logged allocations against the planner.

After llama.cpp creates a context it logs each buffer it allocated ("CPU KV
buffer size = 8.00 MiB", "RS buffer size", "compute buffer size", "output
buffer size"; src/llama-kv-cache.cpp, src/llama-memory-recurrent.cpp,
src/llama-context.cpp). ``check`` parses those lines and compares them with
``planner.plan_memory`` for the same settings, so every user's load is also a
test of the planner. Pure Python: the lines are the engine's ``load_log``.

Every load goes through ``localllm.runtime``, which calls ``check_after_load``
with the engine's log and the header it read for the fit:

    mc = memcheck.check_after_load(path, cfg, engine.load_log, header=header)   # None when unreadable
    mc.ok, mc.report_lines(), mc.to_dict()
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.modelfile.gguf_file import GGUFHeader

from localllm.plan.buffer_log import buffer_lines
from localllm.util.units import MiB, format_size

TOLERANCE = 0.01  # a buffer is flagged when plan and llama.cpp differ by more than this share
# llama.cpp prints MiB with two decimals: a difference up to half a step is rounding,
# plus the byte lost turning the printed figure back into bytes (0.375 MiB, planned
# exactly, prints as 0.38: 5,243 bytes apart, one more than half a step)
_PRINT_STEP = 0.005 * MiB + 1

_FA_OFF = re.compile(r"Flash Attention (?:not supported, set to disabled|was auto, set to disabled)")


@dataclass
class BufferCheck:
    buffer: str  # kv | kv_swa | rs | compute | output
    planned_bytes: int | None
    llama_bytes: int | None  # as printed (two decimals of MiB)
    ratio: float | None  # planned / llama.cpp
    ok: bool


@dataclass
class MemoryCheck:
    ok: bool
    tolerance: float
    verified_architecture: bool
    buffers: list[BufferCheck] = field(default_factory=list)
    error: str | None = None  # the check itself failed (a bug in localllm, said, never hidden as n/a)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def report_lines(self) -> list[str]:
        """What ``run -v`` and ``doctor`` print: each mismatch with both figures, or one line saying the plan held."""
        if self.error is not None:
            return [f"memory check: the check itself failed ({self.error}); the load went on: please report it"]
        lines = self.mismatch_lines()
        if not self.verified_architecture:
            lines.append("memory check: this architecture has no known llama.cpp cache rule (planned as dense)")
        if self.ok:
            lines.insert(0, f"memory check: the plan matches llama.cpp's allocations within {self.tolerance:.0%} ("
                         + ", ".join(f"{b.buffer} {format_size(b.llama_bytes, 'MiB')}" for b in self.buffers if b.llama_bytes is not None) + ")")
        return lines

    def mismatch_lines(self) -> list[str]:
        """One line per buffer where the plan and llama.cpp differ by more than the tolerance."""
        out = []
        for b in self.buffers:
            if b.ok:
                continue
            plan = "n/a" if b.planned_bytes is None else format_size(b.planned_bytes, "MiB")
            real = "n/a" if b.llama_bytes is None else format_size(b.llama_bytes, "MiB")
            out.append(f"memory check: {b.buffer} buffer planned {plan}, llama.cpp allocated {real}")
        return out


def parse_allocations(lines: Iterable[str | tuple[int, str]]) -> dict[str, list[tuple[str, int]]]:
    """Buffers llama.cpp logged, by kind, in log order: {"KV": [(device, bytes)], ...}."""
    out: dict[str, list[tuple[str, int]]] = {"KV": [], "RS": [], "compute": [], "output": []}
    for device, kind, mib in buffer_lines(lines):
        if kind in out:
            out[kind].append((device, round(mib * MiB)))
    return out


def flash_attn_disabled(lines: Iterable[str | tuple[int, str]]) -> bool:
    """llama.cpp resolved flash attention 'auto' to off (src/llama-context.cpp)."""
    return any(_FA_OFF.search(item[1] if isinstance(item, tuple) else item) for item in lines)


def _cmp(name: str, planned: int | None, real: int | None, tol: float) -> BufferCheck:
    if planned is None or real is None:
        return BufferCheck(name, planned, real, None, planned is None and real is None)
    diff = abs(planned - real)
    ok = diff <= max(tol * real, _PRINT_STEP)
    return BufferCheck(name, planned, real, round(planned / real, 4) if real else None, ok)


def check(plan, allocations: dict[str, list[tuple[str, int]]], tol: float = TOLERANCE) -> MemoryCheck:
    """Compare a ``planner.MemoryPlan`` with what llama.cpp logged.

    KV: one buffer per cache (the full-attention cache first, then the
    sliding-window one; llama-kv-cache-iswa.cpp), each summed over devices.
    Compute: the plan's buffer against the largest compute buffer llama.cpp
    logged (the one on the device that runs the layers). A buffer the plan has
    and llama.cpp did not log (or the other way round) is a mismatch."""
    checks: list[BufferCheck] = []
    # KV buffers are logged per cache and per device: group by cache (a new cache
    # starts when a device name repeats).
    caches: list[int] = []
    seen: set[str] = set()
    for dev, n in allocations.get("KV", []):
        if dev in seen or not caches:
            caches.append(0)
            seen = set()
        seen.add(dev)
        caches[-1] += n
    planned_kv = plan.kv_buffer_bytes()
    names = ["kv", "kv_swa"] if len(planned_kv) == 2 or len(caches) == 2 else ["kv"]
    for i, name in enumerate(names):
        checks.append(_cmp(name, planned_kv[i] if i < len(planned_kv) else None, caches[i] if i < len(caches) else None, tol))
    rs_lines = allocations.get("RS", [])
    if plan.rs_bytes or rs_lines:
        checks.append(_cmp("rs", plan.rs_bytes if plan.rs_bytes else None, sum(n for _, n in rs_lines) if rs_lines else None, tol))
    compute = [n for _, n in allocations.get("compute", [])]
    checks.append(_cmp("compute", plan.compute_bytes, max(compute) if compute else None, tol))
    output = sum(n for _, n in allocations.get("output", []))
    at_load = plan.output_bytes if plan.output_at_load_bytes is None else plan.output_at_load_bytes  # it grows later
    checks.append(_cmp("output", at_load, output if allocations.get("output") else None, tol))
    return MemoryCheck(all(c.ok for c in checks), tol, bool(plan.verified), checks)


def check_load(path: str | Path, load_config, lines: Iterable[str | tuple[int, str]], *, gpu: bool | None = None,
               tol: float = TOLERANCE, planned=None, header: GGUFHeader | None = None) -> MemoryCheck:
    """Plan ``path`` with the settings it was loaded with (a ``backend.LoadConfig``)
    and compare with the lines llama.cpp logged while loading it. ``planned``:
    the plan the load was chosen with (``prepare.LoadPlan.plan``, llama.cpp's dry
    run figures in it), used unless llama.cpp turned flash attention off;
    ``header``: the file's, read already for the fit (else read here)."""
    from dataclasses import replace

    # lazy: loads gguf, numpy (~87 ms here), which memcheck does not load at import
    from localllm.modelfile.gguf_file import read_header

    # lazy: loads gguf, numpy (~97 ms here), which memcheck does not load at import
    from localllm.plan import planner

    lines = list(lines)
    alloc = parse_allocations(lines)
    cfg = load_config
    if flash_attn_disabled(lines):
        cfg = replace(cfg, flash_attn="off")
    elif planned is not None:
        return check(planned, alloc, tol)
    if gpu is None:
        gpu = any(dev not in ("CPU", "CPU_Mapped") and not dev.startswith("CPU") for kind in alloc.values() for dev, _ in kind)
    shape = planner.ModelShape.from_header(header if header is not None else read_header(path))
    return check(planner.plan_memory(shape, cfg, gpu=gpu), alloc, tol)


def check_placement(placement, lines: Iterable[str | tuple[int, str]], tol: float = TOLERANCE) -> MemoryCheck:
    """Per device, for a load over several devices (``--rpc``): a
    ``placement.Placement`` against the buffers llama.cpp logged on each device.
    The single-device plan cannot be compared there (each device gets its own
    compute buffer, sized for its part of the graph: placement._compute).
    KV: each device's buffers (full-attention, then sliding-window); compute:
    each device's; output: the CPU's. Weights are not checked (the CPU's mapped
    range and a repacked copy depend on the file's layout and the CPU)."""
    # lazy: loads gguf, numpy (~103 ms here), which memcheck does not load at import
    from localllm.plan.placement import logged_buffers

    logged = logged_buffers([item[1] if isinstance(item, tuple) else item for item in lines])
    checks: list[BufferCheck] = []
    for u in placement.uses:
        got = logged.get(u.device.name, {})
        name = u.device.name
        kv_real = [round(m * MiB) for m in got.get("KV", [])]
        for i in range(max(len(u.kv_by_cache), len(kv_real))):
            checks.append(_cmp(f"{name} kv" + ("_swa" if i else ""), u.kv_by_cache[i] if i < len(u.kv_by_cache) else None,
                               kv_real[i] if i < len(kv_real) else None, tol))
        compute_real = got.get("compute")
        if u.compute_bytes or compute_real:
            checks.append(_cmp(f"{name} compute", u.compute_bytes or None, round(compute_real[0] * MiB) if compute_real else None, tol))
        output_real = got.get("output")
        if u.output_bytes or output_real:
            checks.append(_cmp(f"{name} output", u.output_bytes or None, round(sum(output_real) * MiB) if output_real else None, tol))
    verified = bool(getattr(placement.plan, "verified", True))
    return MemoryCheck(all(c.ok for c in checks), tol, verified, checks)


def check_after_load(path: str | Path, load_config, lines: Iterable[str | tuple[int, str]], placement=None,
                     planned=None, *, header: GGUFHeader | None = None) -> MemoryCheck | None:
    """``check_load`` for the load path (``localllm.runtime``): None (shown as
    n/a / null) when the log holds no allocation lines; a check that itself
    fails says so, and a load never fails on it. With a ``placement`` (a load
    over several devices), ``check_placement``; ``header``: as ``check_load``."""
    lines = list(lines)
    try:
        if not any(parse_allocations(lines).values()):
            return None
        if placement is not None:
            return check_placement(placement, lines)
        return check_load(path, load_config, lines, planned=planned, header=header)
    except Exception as exc:  # noqa: BLE001 - a check of the plan must never break a run, nor hide that it broke
        return MemoryCheck(False, TOLERANCE, True, [], error=f"{type(exc).__name__}: {exc}")

