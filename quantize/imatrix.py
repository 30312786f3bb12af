"""Read an importance matrix (llama-imatrix's GGUF output) for llama.cpp's quantizer.

The GGUF format stores, per weight tensor, ``<name>.in_sum2`` (sums of squared
activations per input column) and ``<name>.counts``; the quantizer wants their
ratio, the mean squared activation per column (llama.cpp's quantize tool does
the same division when it loads the file).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header


def load_imatrix(path: Path) -> dict[str, np.ndarray]:
    import gguf

    read_header(path)  # one-line errors for missing, truncated or non-GGUF files
    reader = gguf.GGUFReader(str(path))
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name.endswith(".in_sum2"):
            sums[t.name[: -len(".in_sum2")]] = np.asarray(t.data, dtype=np.float32)
        elif t.name.endswith(".counts"):
            counts[t.name[: -len(".counts")]] = np.asarray(t.data, dtype=np.float32)
    if not sums:
        raise InputError(f"{path} is not an importance matrix (no '.in_sum2' tensors): make one with llama-imatrix")
    out = {}
    for name, s in sums.items():
        c = counts.get(name)
        n = float(c.reshape(-1)[0]) if c is not None and c.size else 1.0
        out[name] = (s.reshape(-1) / max(n, 1.0)).astype(np.float32)
    return out
