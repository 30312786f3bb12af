"""Image encode here against llama.cpp's ``llama-mtmd-cli``, same projector, image and threads.

Both run the same libmtmd (the vendored llama.cpp); what differs is the path to
it: localllm decodes the picture with Pillow and calls ``mtmd_encode_chunk``
itself (engine/mtmd.py), llama-mtmd-cli reads the file with stb_image and goes
through ``mtmd_helper_eval_chunks``, which logs "mtmd batch encoding done in N ms" (or "image slice encoded in N ms")
($V/tools/mtmd/mtmd-helper.cpp). The figure is the ratio of the medians,
llama-mtmd-cli's encode time over ours (>= 1: we are as fast). Alternating runs.
A second figure: a chat's second turn after an image, its TTFT over the first
turn's (the image stays in the KV cache, so nothing is encoded again: target <= 0.2).

    python -m scripts.bench_vision [--size large] [--threads 1] [--runs 3] [--image FILE]
    python scripts/bench_vision.py --quick    # CI: one run of each (about 6 s)

Needs llama-mtmd-cli built (cmake --build BUILD --target llama-mtmd-cli in
scripts/build_llama_tools.sh's build folder).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file (CI's quick mode) as well as with -m

from scripts import llama_tools  # noqa: E402
from scripts.make_vision_model import write_vision_model  # noqa: E402
from scripts.media_runs import Setup, one_reply, two_turns  # noqa: E402

N_CTX = 512
TEMPLATE = "chatml"  # as llama-mtmd-cli is told: the synthetic model has none


def ours(model: Path, proj: Path, image: Path, threads: int) -> float:
    """One fresh load (as llama-mtmd-cli does per run), one encode: its milliseconds."""
    from localllm.vision.image import load_image

    return one_reply(Setup(model, proj, threads, N_CTX, TEMPLATE), "describe", load_image(image)).encode_ms


def turns(model: Path, proj: Path, image: Path, threads: int) -> tuple[float, float]:
    """A chat's first turn with the image and a second without: both TTFTs (ms)."""
    from localllm.vision.image import load_image

    return two_turns(Setup(model, proj, threads, N_CTX, TEMPLATE), ("what is it?", "and now?"), load_image(image))


def theirs(cli: Path, model: Path, proj: Path, image: Path, threads: int) -> float:
    out = subprocess.run([str(cli), "-m", str(model), "--mmproj", str(proj), "--image", str(image), "-p", "describe", "-n", "1",
                          "-t", str(threads), "--temp", "0", "-c", str(N_CTX), "--chat-template", TEMPLATE], capture_output=True, text=True, timeout=600)
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
    ap.add_argument("--quick", action="store_true", help="CI: one run of each")
    a = ap.parse_args()
    if a.quick:
        a.size, a.runs = "large", 1  # ~6 s: the small projector encodes in under 1 ms, too little to time
    cli = llama_tools.require("llama-mtmd-cli")
    image = a.image or llama_tools.require_source("tools/mtmd/test-1.jpeg")
    with tempfile.TemporaryDirectory() as d:
        model, proj = write_vision_model(d, size=a.size)
        mine, other = [], []
        for _ in range(a.runs):
            mine.append(ours(model, proj, image, a.threads))
            other.append(theirs(cli, model, proj, image, a.threads))
        first, second = turns(model, proj, image, a.threads)
    m, o = statistics.median(mine), statistics.median(other)
    print(f"encode, {a.size} projector, {a.threads} thread(s), median of {a.runs}: localllm {m:.0f} ms, llama-mtmd-cli {o:.0f} ms, "
          f"ratio {o / m:.2f}x (target >= 0.95)")
    print(f"second turn TTFT / first turn's (image kept in the cache): {second / first:.3f} ({second:.1f} ms / {first:.1f} ms, target <= 0.2)")


if __name__ == "__main__":
    main()
