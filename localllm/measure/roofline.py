"""How fast could decode be? Memory bandwidth and the decode ceiling.

Decode reads every weight on the device, plus the KV cache so far, once per
token, so its ceiling is bandwidth / bytes read per token. Two things make that
figure true rather than flattering or harsh:

- The bandwidth is measured with as many threads as the decode uses (llama.cpp
  decodes on every thread it is given; one numpy thread sees a fraction of what
  several cores pull from memory). Each thread streams its own slice of arrays
  much larger than the caches; we keep the better of a read-only pass (a sum:
  decode reads weights, it does not write them) and a copy counted as read +
  write, best of a few passes.
- Layers offloaded to a GPU are read at the GPU's bandwidth (NVIDIA: NVML's
  memory bus width x maximum memory clock x 2 for DDR; Apple: the chip's
  published figure), the rest at the CPU's. A token's time is the sum of both
  parts, since the layers run one after the other.

A decode efficiency above 1.0 would mean this model of the machine is wrong;
the tests hold it at or under 1.0 here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any


def _arrays(mib: int) -> tuple[Any, Any]:
    """A source and a destination of ``mib`` MiB each, their pages touched."""
    import numpy as np

    src = np.ones(mib * 1024 * 1024 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    return src, dst


def measure_bandwidth(mib: int = 256, passes: int = 5, threads: int = 1, arrays: tuple[Any, Any] | None = None) -> float:
    """Bytes per second this machine's memory delivers to ``threads`` threads
    (``arrays``: a source and destination of ``_arrays``, when measured before)."""
    import numpy as np

    threads = max(1, int(threads))
    whole_src, whole_dst = arrays if arrays is not None else _arrays(mib)
    n = len(whole_src) - len(whole_src) % threads
    src, dst = whole_src[:n], whole_dst[:n]
    step = n // threads
    slices = [(src[i * step : (i + 1) * step], dst[i * step : (i + 1) * step]) for i in range(threads)]

    def timed(work) -> float:
        """Seconds for every thread to run ``work`` on its slice (numpy releases the GIL)."""
        if threads == 1:
            t0 = time.perf_counter()
            work(*slices[0])
            return time.perf_counter() - t0
        barrier = threading.Barrier(threads + 1)

        def run(a, b) -> None:
            barrier.wait()
            work(a, b)
            barrier.wait()

        pool = [threading.Thread(target=run, args=s) for s in slices]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        took = time.perf_counter() - t0
        for t in pool:
            t.join()
        return took

    best_read = best_copy = float("inf")
    for _ in range(passes):
        best_read = min(best_read, timed(lambda a, b: a.sum()))
        best_copy = min(best_copy, timed(lambda a, b: np.copyto(b, a)))
    return max(src.nbytes / best_read, 2 * src.nbytes / best_copy)


def measure_by_threads(counts: list[int], mib: int = 256, passes: int = 3) -> dict[int, float]:
    """The bandwidth at each thread count (doctor reports them side by side), on
    one pair of arrays: pages touched for the first time cost more than the
    passes (2.6 s of doctor's 6.3 s went to a second 512 MiB here)."""
    arrays = _arrays(mib)
    return {n: measure_bandwidth(mib=mib, passes=passes, threads=n, arrays=arrays) for n in sorted(set(counts))}


@dataclass(frozen=True)
class Roofline:
    bandwidth_bytes_per_s: float  # the CPU's, at the decode's thread count
    bytes_per_token: int  # weights read per token + the KV cache at this length
    ceiling_tokens_per_s: float | None  # None: a GPU part whose bandwidth is unknown
    measured_tokens_per_s: float | None
    gpu_bytes_per_token: int = 0
    gpu_bandwidth_bytes_per_s: float | None = None

    @property
    def cpu_bytes_per_token(self) -> int:
        return self.bytes_per_token - self.gpu_bytes_per_token

    @property
    def efficiency(self) -> float | None:
        if not self.ceiling_tokens_per_s or self.measured_tokens_per_s is None:
            return None
        return self.measured_tokens_per_s / self.ceiling_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["efficiency"] = self.efficiency
        d["cpu_bytes_per_token"] = self.cpu_bytes_per_token
        return d


def roofline(
    bandwidth: float,
    weights_bytes: int,
    kv_bytes: int,
    measured: float | None,
    *,
    gpu_bytes: int = 0,
    gpu_bandwidth: float | None = None,
) -> Roofline:
    """The decode ceiling for ``weights_bytes + kv_bytes`` read per token, of
    which ``gpu_bytes`` sit in GPU memory and are read at ``gpu_bandwidth``."""
    per_token = weights_bytes + kv_bytes
    cpu_bytes = per_token - gpu_bytes
    if gpu_bytes and not gpu_bandwidth:
        ceiling = None
    else:
        seconds = (cpu_bytes / bandwidth if cpu_bytes else 0.0) + (gpu_bytes / gpu_bandwidth if gpu_bytes and gpu_bandwidth else 0.0)
        ceiling = 1.0 / seconds if seconds > 0 else None
    return Roofline(bandwidth, per_token, ceiling, measured, gpu_bytes, gpu_bandwidth)
