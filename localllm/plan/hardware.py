"""What memory this machine has for a model: GPU budget and RAM.

- NVIDIA: total and free VRAM through NVML (nvidia-ml-py), first GPU.
- Apple Silicon: unified memory; Metal lets one process wire about two thirds
  of RAM on machines up to 36 GB (``recommendedMaxWorkingSetSize``), three
  quarters above that. We use that share as the GPU budget.
- Otherwise no GPU budget: the model runs from RAM (psutil).
``--vram SIZE`` overrides the detected GPU budget, to plan for a laptop.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

from localllm.util.units import parse_size  # noqa: F401 - the one size parser, imported from here by callers


@dataclass(frozen=True)
class Hardware:
    gpu_name: str | None
    gpu_total_bytes: int | None
    gpu_free_bytes: int | None
    gpu_source: str  # "nvml", "apple-unified", "--vram", "none"
    ram_total_bytes: int
    ram_available_bytes: int

    @property
    def gpu_budget(self) -> int | None:
        return self.gpu_free_bytes if self.gpu_free_bytes is not None else self.gpu_total_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_budget_bytes"] = self.gpu_budget
        return d


def _nvml() -> tuple[str, int, int] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no NVIDIA GPU: NVML raises its own error types
        return None
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        return (name.decode() if isinstance(name, bytes) else str(name)), int(mem.total), int(mem.free)
    finally:
        pynvml.nvmlShutdown()


def detect(vram: int | None = None) -> Hardware:
    import psutil

    vm = psutil.virtual_memory()
    if vram is not None:
        return Hardware("simulated", vram, None, "--vram", vm.total, vm.available)
    nv = _nvml()
    if nv:
        return Hardware(nv[0], nv[1], nv[2], "nvml", vm.total, vm.available)
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        share = 2 / 3 if vm.total <= 36 * 1024**3 else 3 / 4
        return Hardware("Apple Silicon (unified memory)", int(vm.total * share), None, "apple-unified", vm.total, vm.available)
    return Hardware(None, None, None, "none", vm.total, vm.available)


def physical_cores() -> int:
    """Physical cores, no more than the CPUs this process may run on (``taskset``, a
    container's cpuset, where the OS says: Linux): llama.cpp's default thread count
    here, and the roofline's. llama.cpp decode does not gain from hyper-threads, and
    a thread with no CPU of its own makes every op's barrier wait for it."""
    import os

    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity mask to read
        return cores
    return max(1, min(cores, allowed))


def gpu_memory_bandwidth() -> float | None:
    """Peak memory bandwidth of the GPU the layers are offloaded to, bytes/s:
    NVIDIA from NVML (memory bus width x maximum memory clock x 2), Apple from
    the chip's published figure; None where neither is known (the roofline then
    says n/a for the GPU's part instead of guessing)."""

    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
        except Exception:  # no driver / no NVIDIA GPU: NVML raises its own error types
            pass
        else:
            try:
                if pynvml.nvmlDeviceGetCount() >= 1:
                    h = pynvml.nvmlDeviceGetHandleByIndex(0)
                    bus = int(pynvml.nvmlDeviceGetMemoryBusWidth(h))
                    clock = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))
                    if bus > 0 and clock > 0:
                        return nvidia_bandwidth(bus, clock)
            except Exception:  # an NVML without these queries: unknown, not a guess
                return None
            finally:
                pynvml.nvmlShutdown()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        import subprocess

        try:
            chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return apple_bandwidth(chip)
    return None


# Published unified-memory bandwidth of Apple's chips, bytes/s (Apple's spec
# pages). Where a chip comes in two memory configurations, the lower one.
APPLE_BANDWIDTH = {
    "M1": 68.25e9, "M1 Pro": 200e9, "M1 Max": 400e9, "M1 Ultra": 800e9,
    "M2": 100e9, "M2 Pro": 200e9, "M2 Max": 400e9, "M2 Ultra": 800e9,
    "M3": 100e9, "M3 Pro": 150e9, "M3 Max": 300e9, "M3 Ultra": 819e9,
    "M4": 120e9, "M4 Pro": 273e9, "M4 Max": 410e9,
}


def nvidia_bandwidth(bus_width_bits: int, max_mem_clock_mhz: int) -> float:
    """Peak DRAM bandwidth from what NVML reports: bus width x memory clock x 2
    (two transfers per clock, as NVML's memory clock is the DDR base clock)."""
    return bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * 2


def apple_bandwidth(chip: str) -> float | None:
    """``'Apple M2 Pro'`` -> 200e9; None for a chip we have no figure for."""
    name = chip.replace("Apple", "").strip()
    return APPLE_BANDWIDTH.get(name)
