"""``localllm pull`` against huggingface_hub's own ``hf_hub_download``, same file,
same loopback server (tests/helpers/fake_hub.py), side by side in one run.

    .venv/bin/python -m scripts.bench_pull [--model smollm2] [--reps 3]

Both write the same Hugging Face cache layout; pull also checks the sha256 and
keeps a resumable partial file. Prints the median wall time of each, the ratio,
and what hashing the file alone costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root, for scripts.* and tests.*

from localllm.store import resolver
from tests.helpers.fake_hub import FakeHub


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repetition (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.reps = 1
    src = resolver.resolve(a.model)
    hub = FakeHub().start()
    hub.add("bench/Model-GGUF", src.name, src)
    root = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(root / "hf"), "LOCALLLM_HOME": str(root / "home"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    lib = f"import sys, huggingface_hub as h; h.hf_hub_download('bench/Model-GGUF', {src.name!r})"
    ours_cmd = [sys.executable, "-m", "localllm", "pull", "bench/Model-GGUF", "--file", src.name, "--json"]
    lib_cmd = [sys.executable, "-c", lib]
    times: dict[str, list[float]] = {"localllm pull": [], "hf_hub_download": []}
    try:
        for _ in range(a.reps):
            for label, cmd in (("localllm pull", ours_cmd), ("hf_hub_download", lib_cmd)):
                shutil.rmtree(root / "hf", ignore_errors=True)
                t0 = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                times[label].append(time.perf_counter() - t0)
    finally:
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)
    size = src.stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:<16} {v * 1000:8.0f} ms  {size / v / 1e6:7.1f} MB/s  (median of {a.reps}, {size / 1e6:.1f} MB, process start included)")
    import hashlib

    data = src.read_bytes()
    t0 = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    sha_ms = (time.perf_counter() - t0) * 1000
    print(f"ratio localllm/huggingface_hub: {med['localllm pull'] / med['hf_hub_download']:.3f}")
    print(
        f"difference {(med['localllm pull'] - med['hf_hub_download']) * 1000:.0f} ms; "
        f"the sha256 check alone (which hf_hub_download skips) costs {sha_ms:.0f} ms here"
    )


if __name__ == "__main__":
    main()
