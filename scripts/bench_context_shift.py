"""Context shift against re-processing the kept window, and decode speed by cache type.

1. At n_ctx 2048 on the default model: fill the context, then time one shift
   in place (seq_rm + seq_add, what localllm does) against re-evaluating the
   kept window from an empty cache (what a cache that cannot shift must do),
   alternating, side by side. Target: shift <= 10% of re-processing.
2. Decode tokens/s with q8_0 and q4_0 caches against f16 at the same depth.

    python scripts/bench_context_shift.py [--model smollm2] [--reps 5]
"""

from __future__ import annotations

import argparse
import random
import statistics

from localllm.engine import KVCache, LlamaCppBackend, ModelHandle
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.engine_api.stats import ShiftRecord
from localllm.store import resolver


def fill(b: KVCache, n: int, seed: int) -> None:
    rng = random.Random(seed)
    n_vocab = 1000
    b.reset()
    b.append([rng.randrange(10, n_vocab) for _ in range(n)])


def shift_ms(b: KVCache, n_keep: int) -> float:
    shifts: list[ShiftRecord] = []
    b.make_room(1, n_keep, shifts)
    # the shift is applied to the cache on the next decode (RoPE re-rotation): include it
    import time

    t0 = time.perf_counter_ns()
    b.handle.decode([42])
    b.record([42])
    return shifts[0].ms + (time.perf_counter_ns() - t0) / 1e6


def reprocess_ms(b: KVCache, n_keep: int, tokens: list[int] | None = None) -> float:
    """Re-evaluate the window a full cache of ``tokens`` (default: the cache's own) keeps,
    from an empty cache: what is timed starts with the reset, so the cache may hold anything."""
    import time

    tokens = b.tokens if tokens is None else tokens
    n_discard = (len(tokens) - n_keep) // 2
    kept = tokens[:n_keep] + tokens[n_keep + n_discard :]
    t0 = time.perf_counter_ns()
    b.reset()
    b.append(kept)
    return (time.perf_counter_ns() - t0) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--quick", action="store_true",
                    help="one repetition, few tokens, one fill of the context for both ways (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    prompt_len, gen = 512, 128
    if a.quick:
        a.reps, a.ctx, prompt_len, gen = 1, 256, 32, 8  # llama.cpp's smallest context: half the quick run's prefill
    path = resolver.resolve(a.model)
    handle = ModelHandle.open(path, LoadConfig(n_ctx=a.ctx))  # the engine's own parts: the KV cache, timed alone
    cache = KVCache(handle)
    n_keep = 64
    shifts, reprocs = [], []
    for r in range(a.reps):
        if a.quick:  # filling the context is most of a quick run: fill once, shift, then re-process what the full cache held
            fill(cache, handle.n_ctx, r)
            full = cache.tokens
            shifts.append(shift_ms(cache, n_keep))
            reprocs.append(reprocess_ms(cache, n_keep, full))
            continue
        for which in (("s", "r") if r % 2 == 0 else ("r", "s")):
            fill(cache, handle.n_ctx, r)
            if which == "s":
                shifts.append(shift_ms(cache, n_keep))
            else:
                reprocs.append(reprocess_ms(cache, n_keep))
    s, rp = statistics.median(shifts), statistics.median(reprocs)
    print(f"{path.name}, n_ctx {handle.n_ctx}, keep {n_keep}, drop half of the rest, median of {a.reps}:")
    print(f"  shift in place (incl. the next decode): {s:8.2f} ms")
    print(f"  re-process the kept window:             {rp:8.2f} ms")
    print(f"  ratio {s / rp:.3f} ({'ok' if s / rp <= 0.10 else 'ABOVE 0.10'})")
    handle.close()

    print(f"\ndecode tokens/s by cache type ({gen} tokens after a {prompt_len}-token prompt, median of reps):")
    base = None
    for kv in ("f16", "q8_0", "q4_0"):
        b = LlamaCppBackend()
        b.load(path, LoadConfig(n_ctx=1024, type_k=kv, type_v=kv, flash_attn="on"))
        rates = []
        for r in range(a.reps):
            rng = random.Random(r)
            prompt = [rng.randrange(10, 1000) for _ in range(prompt_len)]
            rates.append(b.stream(prompt, SamplingConfig(temperature=0, max_tokens=gen, ignore_eos=True)).drain().decode_tokens_per_s)
        m = statistics.median(rates)
        base = base or m
        print(f"  {kv:<5} {m:8.2f} t/s  ({m / base:.3f}x f16)")
        b.close()
    return 0 if s / rp <= 0.10 or a.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
