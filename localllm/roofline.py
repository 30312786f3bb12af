"""How fast could decode be? Memory bandwidth and the decode ceiling.

Decode reads every weight on the device, plus the KV cache so far, once per
token, so its ceiling is bandwidth / bytes read per token. The bandwidth is
measured here with a streaming copy in numpy (the best of a few passes over
arrays much larger than the caches): one core's view of the memory system,
which is what a 2-thread decode on a laptop gets close to.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


def measure_bandwidth(mib: int = 256, passes: int = 5) -> float:
    """Bytes per second moved by ``np.copyto`` (a read plus a write per byte copied)."""
    import numpy as np

    n = mib * 1024 * 1024 // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


@dataclass(frozen=True)
class Roofline:
    bandwidth_bytes_per_s: float
    bytes_per_token: int  # weights read per token + the KV cache at this length
    ceiling_tokens_per_s: float
    measured_tokens_per_s: float

    @property
    def efficiency(self) -> float:
        return self.measured_tokens_per_s / self.ceiling_tokens_per_s if self.ceiling_tokens_per_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["efficiency"] = self.efficiency
        return d


def roofline(bandwidth: float, weights_bytes: int, kv_bytes: int, measured: float) -> Roofline:
    per_token = weights_bytes + kv_bytes
    return Roofline(bandwidth, per_token, bandwidth / per_token if per_token else 0.0, measured)
