"""The decode rate a plan predicts, before anything loads: the roofline of the
weights one token reads, each part at its own memory's bandwidth.

A MoE token reads all of its layers' dense weights but only ``n_expert_used``
of ``n_expert`` experts; with ``--cpu-moe``/``--n-cpu-moe`` (or the fit's
choice) those experts are read from RAM at the CPU's bandwidth and the rest
from GPU memory at the GPU's. The KV cache is left out (a short context: the
ceiling at the start of a reply), so the figure is an upper bound, labelled
as one. The RAM bandwidth is measured here (``roofline.measure_bandwidth``,
128 MiB, the decode's thread count: about 0.2 s); the GPU's is NVML's or the
Apple chip's, or unknown, and then the RAM part's own bound is the figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from localllm.measure.doctor import gpu_weights_read_per_token, weights_read_per_token
from localllm.measure.roofline import measure_bandwidth, roofline
from localllm.plan import planner
from localllm.util.fmt import size

SOURCE = "roofline: bytes one token reads / bandwidth, KV cache left out (an upper bound)"


@dataclass(frozen=True)
class Prediction:
    ram_bytes_per_token: int
    gpu_bytes_per_token: int
    ram_bandwidth_bytes_per_s: float  # measured now
    gpu_bandwidth_bytes_per_s: float | None  # None: unknown (no NVML / Apple figure, or --vram on a machine without a GPU)
    ceiling_tokens_per_s: float | None  # both parts; None where the GPU's bandwidth is unknown
    ram_bound_tokens_per_s: float | None  # the RAM part alone (an upper bound whatever the GPU); None: nothing read from RAM
    source: str = SOURCE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for ``plan``."""
        ram = f"{size(self.ram_bytes_per_token)} from RAM at {self.ram_bandwidth_bytes_per_s / 1e9:.1f} GB/s (measured)"
        if self.gpu_bytes_per_token:
            gbw = "n/a" if self.gpu_bandwidth_bytes_per_s is None else f"{self.gpu_bandwidth_bytes_per_s / 1e9:.0f} GB/s"
            ram += f", {size(self.gpu_bytes_per_token)} from GPU memory at {gbw}"
        if self.ceiling_tokens_per_s is not None:
            rate = f"at most {self.ceiling_tokens_per_s:.1f} t/s"
        elif self.ram_bound_tokens_per_s is not None:
            rate = f"n/a (the GPU's bandwidth is unknown); the RAM part alone caps it at {self.ram_bound_tokens_per_s:.1f} t/s"
        else:
            rate = "n/a (the GPU's bandwidth is unknown)"
        return f"predicted decode: {rate} (the roofline, an upper bound): a token reads {ram}"


# RAM bandwidth measured in this process, by thread count: a second plan in one
# process (the library's callers, a test suite's in-process CLI), and each model
# the cockpit loads, read the figure the first measured (384 MiB of copies, 0.35 s
# here) instead of measuring again: the RAM does not change within a process.
_MEASURED: dict[int, float] = {}


def measured_ram_bandwidth(threads: int) -> float:
    """This machine's RAM bandwidth with ``threads`` threads, measured once a process."""
    if threads not in _MEASURED:
        _MEASURED[threads] = measure_bandwidth(mib=128, passes=3, threads=threads)
    return _MEASURED[threads]


def predict(shape: planner.ModelShape, plan: planner.MemoryPlan, *, gpu: bool, gpu_bandwidth: float | None, threads: int,
            ram_bandwidth: float | None = None) -> Prediction:
    """The decode ceiling of ``plan`` (``ram_bandwidth``: measured here when not given)."""
    bw = ram_bandwidth if ram_bandwidth is not None else measured_ram_bandwidth(threads)
    gpu_read = gpu_weights_read_per_token(shape, plan, gpu)
    rf = roofline(bw, weights_read_per_token(shape), 0, None, gpu_bytes=gpu_read, gpu_bandwidth=gpu_bandwidth)
    ram_read = rf.cpu_bytes_per_token
    return Prediction(ram_read, gpu_read, bw, gpu_bandwidth, rf.ceiling_tokens_per_s, bw / ram_read if ram_read else None)
