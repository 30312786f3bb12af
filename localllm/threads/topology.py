"""Where the thread count starts: the fast cores this process may run on.

- Apple silicon: the performance cores (``sysctl hw.perflevel0.physicalcpu``);
  a decode thread on an efficiency core makes every op's barrier wait for it.
- Intel hybrid CPUs on Linux: the P-cores (``/sys/devices/cpu_core/cpus``), for
  the same reason with E-cores; the start says so.
- Other CPUs: the physical cores, not their SMT siblings (two threads on one
  core share its vector units, and decode does not gain from them), counted from
  ``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`` over the CPUs in
  this process's affinity mask; where /sys hides that, ``plan.hardware.physical_cores``
  (psutil's count, capped at the affinity mask) and one line saying so.

The controller (``controller.py``) then moves from there as it measures; the
ceiling is the logical CPUs this process may run on.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localllm.plan.hardware import physical_cores


@dataclass(frozen=True)
class Start:
    threads: int  # where the count starts
    ceiling: int  # the most it may try: logical CPUs this process may run on
    why: str  # "2 physical cores", "6 P-cores of an Intel hybrid CPU (/sys/devices/cpu_core/cpus)"
    note: str | None = None  # one line for the user: the topology was hidden, a hybrid CPU's E-cores left out


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format: ``0-3,8,10-11`` -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (taskset, a container's cpuset, the test
    suite's pinning of each xdist worker); all of them where the OS has no mask."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return set(range(os.cpu_count() or 1))


def _cores(cpus: Iterable[int], sysfs: Path) -> int:
    """Physical cores among ``cpus``: distinct SMT sibling groups. Raises OSError
    or ValueError where /sys does not say."""
    groups = set()
    for c in cpus:
        text = (sysfs / f"devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text()
        groups.add(frozenset(parse_cpu_list(text)))
    if not groups:
        raise ValueError("no CPU")
    return len(groups)


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def start_threads(*, system: str | None = None, machine: str | None = None, sysfs: Path = Path("/sys"),
                  allowed: set[int] | None = None, sysctl: Callable[[str], str | None] = _sysctl,
                  fallback: Callable[[], int] = physical_cores) -> Start:
    """The starting count for this machine (arguments: for tests, a fake /sys or sysctl)."""
    system = system or platform.system()
    machine = machine or platform.machine()
    cpus = allowed if allowed is not None else allowed_cpus()
    ceiling = max(1, min(len(cpus) or 1, 512))  # 512: GGML_MAX_N_THREADS

    def fell_back(what: str) -> Start:
        n = max(1, min(fallback(), ceiling))
        return Start(n, ceiling, f"{n} physical cores (psutil)", f"{what}: starting from {n} threads, psutil's core count")

    if system == "Darwin" and machine == "arm64":
        got = sysctl("hw.perflevel0.physicalcpu")
        if got and got.isdigit() and int(got) > 0:
            n = min(int(got), ceiling)
            return Start(n, ceiling, f"{n} performance cores (hw.perflevel0.physicalcpu)")
        return fell_back("sysctl did not give the performance cores (hw.perflevel0.physicalcpu)")
    if system != "Linux":
        n = max(1, min(fallback(), ceiling))
        return Start(n, ceiling, f"{n} physical cores")
    try:
        pcores = parse_cpu_list((sysfs / "devices/cpu_core/cpus").read_text())
    except (OSError, ValueError):
        pcores = set()
    try:
        if pcores:
            mine = pcores & cpus
            if mine:
                n = _cores(mine, sysfs)
                return Start(n, ceiling, f"{n} P-cores of an Intel hybrid CPU (/sys/devices/cpu_core/cpus)",
                             f"Intel hybrid CPU: starting from the {n} P-cores, not the E-cores")
            # pinned to E-cores only: they are what there is
        n = _cores(cpus, sysfs)
        return Start(n, ceiling, f"{n} physical core{'s' if n > 1 else ''}")
    except (OSError, ValueError):
        return fell_back("the CPU topology is hidden (/sys/devices/system/cpu is not readable)")
