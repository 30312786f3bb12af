"""Experts in RAM, measured: decode and prefill of a synthetic mixture of experts
in three setups, side by side in one run.

    python scripts/bench_moe.py [--quick] [--threads 1] [--reps 3]

1. local only: every tensor on this machine's CPU;
2. experts in RAM (``--n-cpu-moe N_LAYER``), everything else (attention, norms,
   router, shared expert, output, KV cache) on a loopback RPC worker that
   stands in for the GPU: ``localllm``'s engine;
3. llama-bench with the same placement (``-rpc`` the same worker, ``-ngl 99
   -ncmoe N_LAYER``): the same tensor-buffer overrides, llama.cpp's own loop.

Target: 2. at >= 0.95x 3.'s decode rate (the median of per-pair ratios: the two
alternate, so that other load on the machine hits both alike). On loopback the "GPU" is this CPU
behind a socket, so 2. is slower than 1. here: each layer's attention is a
round trip to the worker and back to the experts on the CPU. On a laptop with a
real GPU the same split reads the experts from RAM at the CPU's bandwidth and
the rest from VRAM (``localllm plan`` predicts the rate); what this script
holds is that localllm drives the split as fast as llama.cpp does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.engine import LlamaCppBackend  # noqa: E402
from localllm.engine_api import LoadConfig  # noqa: E402
from localllm.measure.bench import BenchRow, run_bench  # noqa: E402
from localllm.modelfile.model_info import describe  # noqa: E402
from scripts.bench_rpc import start_worker, stop_worker  # noqa: E402
from scripts.llama_tools import FIX, tool  # noqa: E402
from scripts.synth_gguf import SynthSpec, write_gguf  # noqa: E402

# a qwen2moe with a shared expert: 16 experts of which 2 per token, f16
FULL = SynthSpec(arch="qwen2moe", n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1024, n_expert=16, n_expert_used=2, n_ff_exp=512,
                 n_ff_shexp=512, dtype="f16", n_ctx_train=4096, name="synthetic-qwen2moe")
QUICK = replace(FULL, n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff_exp=256, n_ff_shexp=256)


def ours(path: Path, cfg: LoadConfig, prompt: int, gen: int, reps: int) -> BenchRow:
    with LlamaCppBackend() as b:
        b.load(path, cfg)
        d = describe(b.header)
        return run_bench(b, prompt_lengths=[prompt], gen_tokens=gen, reps=reps, n_vocab=d.n_vocab,
                         bos=b.header.get("tokenizer.ggml.bos_token_id"))[0]


def llama_bench(path: Path, ep: str, n_cpu_moe: int, prompt: int, gen: int, reps: int, threads: int) -> tuple[float, float] | str:
    """(pp t/s, tg t/s) from llama-bench with the same placement, or why not."""
    llama_bench_exe = tool("llama-bench")
    if not llama_bench_exe.exists():
        return f"not run ({llama_bench_exe} missing: {FIX})"
    cmd = [str(llama_bench_exe), "-m", str(path), "-rpc", ep, "-ngl", "99", "-ncmoe", str(n_cpu_moe), "-p", str(prompt), "-n", str(gen),
           "-r", str(reps), "-t", str(threads), "-fa", "1", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        tests = json.loads(r.stdout)
        return (next(x["avg_ts"] for x in tests if x["n_prompt"] and not x["n_gen"]),
                next(x["avg_ts"] for x in tests if x["n_gen"] and not x["n_prompt"]))
    except (ValueError, KeyError, StopIteration, TypeError):
        return "failed: " + ((r.stderr.strip().splitlines() or ["no output"])[-1][:200])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller model, one short prompt, few tokens, one pair")
    ap.add_argument("--threads", type=int, default=1, help="threads for the local CPU and for the worker (default 1)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=256, help="tokens generated a run (default 256: on loopback 64 are too few to measure the round trips)")
    ap.add_argument("--pairs", type=int, default=9, help="localllm and llama-bench runs, alternating (default 9)")
    a = ap.parse_args()
    import logging

    logging.getLogger("localllm.llama").setLevel(logging.ERROR)  # llama.cpp's advice on mmap with overrides: llama-bench mmaps too
    spec = QUICK if a.quick else FULL
    prompt, gen, pairs = (32, 16, 1) if a.quick else (a.prompt, a.gen, a.pairs)
    proc, ep = start_worker(a.threads)
    try:
        with tempfile.TemporaryDirectory() as d:
            path = write_gguf(Path(d) / "moe.gguf", spec)
            n = spec.n_layer
            base = LoadConfig(n_ctx=1024, n_threads=a.threads, flash_attn="on")
            print(f"synthetic {spec.arch}: {n} layers, {spec.n_expert} experts ({spec.n_expert_used} a token), shared expert, "
                  f"{path.stat().st_size / 2**20:.0f} MiB · prompt {prompt} · {gen} generated · {pairs} pair(s), alternating · "
                  f"{a.threads} thread(s) · {ep}")
            print(f"{'setup':<60}{'prefill t/s':>14}{'decode t/s':>14}")
            local = ours(path, replace(base, n_gpu_layers=0), prompt, gen, 1)
            print(f"{'local only':<60}{local.pp_tokens_per_s:>9.1f}     {local.tg_tokens_per_s:>9.1f}", flush=True)
            split_cfg = replace(base, n_gpu_layers=-1, rpc_servers=(ep,), tensor_split=(1.0,), n_cpu_moe=n)
            rows: list[tuple[float, float, float, float]] = []  # (ours pp, ours tg, llama-bench pp, llama-bench tg) per pair
            for _ in range(pairs):  # alternating, so that a load on the machine hits both alike
                r = ours(path, split_cfg, prompt, gen, 1)
                ref = llama_bench(path, ep, n, prompt, gen, 1, a.threads)
                if isinstance(ref, str):
                    print(f"{'llama-bench, same placement':<60} {ref}")
                    return 0
                rows.append((r.pp_tokens_per_s, r.tg_tokens_per_s, *ref))
            med = [statistics.median(col) for col in zip(*rows)]
            print(f"{f'localllm: experts in RAM (--n-cpu-moe {n}), rest on the worker':<60}{med[0]:>9.1f}     {med[1]:>9.1f}")
            print(f"{f'llama-bench -rpc -ngl 99 -ncmoe {n}':<60}{med[2]:>9.1f}     {med[3]:>9.1f}")
            print("(medians of the pairs)")
            tg = [x[1] / x[3] for x in rows]
            pp = [x[0] / x[2] for x in rows]
            print()
            print(f"decode, localllm / llama-bench with the same placement (target >= 0.95): {statistics.median(tg):.3f} "
                  f"(median of {len(tg)} pairs, {min(tg):.3f}..{max(tg):.3f})")
            print(f"prefill, localllm / llama-bench: {statistics.median(pp):.3f}")
    finally:
        stop_worker(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
