"""Is localllm's engine as fast as llama.cpp allows? Side by side, in one run.

For each prompt length, rounds alternate between
  A: ``localllm bench``'s code path (localllm.measure.bench.run_bench on LlamaCppBackend), and
  B: a plain loop over llama-cpp-python's low-level API (llama_decode + greedy
     sampler), with the same model, threads, context, batch and random prompt,
and the script prints pp and tg t/s for both and the ratio A/B. The target is a
ratio of at least 0.97 for each; the exit code is 1 if one falls short.

    python scripts/bench_vs_lowlevel.py [--model smollm2] [--prompt-tokens 128,512,2048] [--gen-tokens 128] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import llama_cpp

from localllm.engine import LlamaCppBackend, default_threads, install_log_router
from localllm.engine_api import LoadConfig
from localllm.measure.bench import random_prompt, run_bench
from localllm.modelfile.model_info import inspect_model
from localllm.store import resolver


class PlainLoop:
    """What a user would write with the low-level bindings alone."""

    def __init__(self, path: str, n_ctx: int, n_batch: int, n_threads: int) -> None:
        mp = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        self.n_batch = n_batch
        self.sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(self.sampler, llama_cpp.llama_sampler_init_greedy())

    def run(self, tokens: list[int], n_gen: int) -> tuple[float, float]:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        t0 = time.perf_counter()
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i : i + self.n_batch]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
        llama_cpp.llama_synchronize(self.ctx)
        pp = len(tokens) / (time.perf_counter() - t0)
        decode_s = 0.0
        for _ in range(n_gen - 1):
            tok = llama_cpp.llama_sampler_sample(self.sampler, self.ctx, -1)
            arr = (llama_cpp.llama_token * 1)(tok)
            t1 = time.perf_counter()
            llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(arr, 1))
            llama_cpp.llama_synchronize(self.ctx)
            decode_s += time.perf_counter() - t1
        llama_cpp.llama_sampler_sample(self.sampler, self.ctx, -1)
        return pp, (n_gen - 1) / decode_s

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.sampler)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def _spread(xs: list[float]) -> str:
    """The sample standard deviation, or n/a: one repetition has no spread."""
    return f"{statistics.stdev(xs):.2f}" if len(xs) > 1 else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", default="128,512,2048")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="one repetition of pp64/tg16 (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.prompt_tokens, a.gen_tokens, a.reps = "64", 16, 1
    lengths = [int(x) for x in a.prompt_tokens.split(",")]
    path = resolver.resolve(a.model)
    info = inspect_model(path)
    threads = a.threads or default_threads()
    n_ctx = (max(lengths) + a.gen_tokens + 255) // 256 * 256
    install_log_router()
    engine = LlamaCppBackend()
    engine.load(path, LoadConfig(n_ctx=n_ctx, n_threads=threads, n_batch=512, n_ubatch=512))
    plain = PlainLoop(str(path), n_ctx, 512, threads)
    bos = engine.header.get("tokenizer.ggml.bos_token_id")
    plain.run(random_prompt(64, info.n_vocab, bos, 0), 8)  # warm-up (A warms up inside run_bench)
    print(f"{info.name} {info.file_type}, {threads} threads, ctx {n_ctx}, llama-cpp-python {llama_cpp.__version__}")
    print(f"{'test':>14} | {'localllm t/s':>16} | {'low-level t/s':>16} | ratio")
    ok = True
    for p in lengths:
        pp_a, tg_a, pp_b, tg_b = [], [], [], []
        for r in range(a.reps):
            prompt = random_prompt(p, info.n_vocab, bos, 42 + r)
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for side in order:
                if side == "A":
                    row = run_bench(engine, prompt_lengths=[p], gen_tokens=a.gen_tokens, reps=1, n_vocab=info.n_vocab, bos=bos, seed=42 + r)[0]
                    pp_a.append(row.pp_tokens_per_s)
                    tg_a.append(row.tg_tokens_per_s)
                else:
                    pp, tg = plain.run(prompt, a.gen_tokens)
                    pp_b.append(pp)
                    tg_b.append(tg)
        for name, xs, ys in ((f"pp{p}", pp_a, pp_b), (f"tg{a.gen_tokens}@{p}", tg_a, tg_b)):
            ratio = statistics.mean(xs) / statistics.mean(ys)
            ok &= ratio >= 0.97
            print(
                f"{name:>14} | {statistics.mean(xs):8.2f} ± {_spread(xs):>5} | "
                f"{statistics.mean(ys):8.2f} ± {_spread(ys):>5} | {ratio:.3f} {'ok' if ratio >= 0.97 else 'BELOW 0.97'}"
            )
    engine.close()
    plain.close()
    return 0 if ok or a.quick else 1


if __name__ == "__main__":
    sys.exit(main())
