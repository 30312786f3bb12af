"""Image encode here against llama.cpp's ``llama-mtmd-cli``, same projector, image and threads.

Both run the same libmtmd (the vendored llama.cpp); what differs is the path to
it: localllm decodes the picture with Pillow and calls ``mtmd_encode_chunk``
itself (engine/mtmd.py), llama-mtmd-cli reads the file with stb_image and goes
through ``mtmd_helper_eval_chunks``, which logs "mtmd batch encoding done in N ms" (or "image slice encoded in N ms")
($V/tools/mtmd/mtmd-helper.cpp). The figure is the ratio of the medians,
llama-mtmd-cli's encode time over ours (>= 1: we are as fast). Alternating runs.

    python -m scripts.bench_vision [--size large] [--threads 1] [--runs 3] [--image FILE]

Needs llama-mtmd-cli built (cmake --build BUILD --target llama-mtmd-cli in
scripts/build_llama_tools.sh's build folder).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from scripts import llama_tools
from scripts.make_vision_model import write_vision_model


def ours(model: Path, proj: Path, image: Path, threads: int) -> float:
    """One fresh load (as llama-mtmd-cli does per run), one encode: its milliseconds."""
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig, SamplingConfig
    from localllm.vision.image import load_image

    b = LlamaCppBackend()
    try:
        b.load(model, LoadConfig(n_ctx=512, n_threads=threads))
        b.load_projector(proj)
        b.use_template("chatml")  # as llama-mtmd-cli is told: the synthetic model has none
        with b.stream_images("describe", [load_image(image)], SamplingConfig(temperature=0, max_tokens=1)) as g:
            list(g)
        assert g.stats is not None and g.stats.encode_ms is not None
        return g.stats.encode_ms
    finally:
        b.close()


def theirs(cli: Path, model: Path, proj: Path, image: Path, threads: int) -> float:
    out = subprocess.run([str(cli), "-m", str(model), "--mmproj", str(proj), "--image", str(image), "-p", "describe", "-n", "1",
                          "-t", str(threads), "--temp", "0", "-c", "512", "--chat-template", "chatml"], capture_output=True, text=True, timeout=600)
    m = re.search(r"(?:slice encoded|batch encoding done) in (\d+) ms", out.stdout + out.stderr)
    if m is None:
        raise SystemExit(f"llama-mtmd-cli printed no encode time (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("small", "large"), default="large")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", type=Path, default=None, help="default: the vendored tools/mtmd/test-1.jpeg")
    a = ap.parse_args()
    cli = llama_tools.require("llama-mtmd-cli")
    image = a.image or llama_tools.require_source("tools/mtmd/test-1.jpeg")
    with tempfile.TemporaryDirectory() as d:
        model, proj = write_vision_model(d, size=a.size)
        mine, other = [], []
        for _ in range(a.runs):
            mine.append(ours(model, proj, image, a.threads))
            other.append(theirs(cli, model, proj, image, a.threads))
    m, o = statistics.median(mine), statistics.median(other)
    print(f"encode, {a.size} projector, {a.threads} thread(s), median of {a.runs}: localllm {m:.0f} ms, llama-mtmd-cli {o:.0f} ms, "
          f"ratio {o / m:.2f}x (target >= 0.95)")


if __name__ == "__main__":
    main()
