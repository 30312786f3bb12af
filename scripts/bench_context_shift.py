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

from localllm import catalog
from localllm.backend import LoadConfig, SamplingConfig
from localllm.engine import LlamaCppBackend
from localllm.metrics import ShiftRecord


def fill(b: LlamaCppBackend, n: int, seed: int) -> None:
    rng = random.Random(seed)
    n_vocab = 1000
    b.reset()
    tokens = [rng.randrange(10, n_vocab) for _ in range(n)]
    for chunk in b._prompt_chunks(tokens):
        b._decode(chunk)
        b.cache_tokens.extend(chunk)


def shift_ms(b: LlamaCppBackend, n_keep: int) -> float:
    shifts: list[ShiftRecord] = []
    b._make_room(1, n_keep, shifts)
    # the shift is applied to the cache on the next decode (RoPE re-rotation): include it
    import time

    t0 = time.perf_counter_ns()
    b._decode([42])
    b.cache_tokens.append(42)
    return shifts[0].ms + (time.perf_counter_ns() - t0) / 1e6


def reprocess_ms(b: LlamaCppBackend, n_keep: int) -> float:
    import time

    n_past = len(b.cache_tokens)
    n_discard = (n_past - n_keep) // 2
    kept = b.cache_tokens[:n_keep] + b.cache_tokens[n_keep + n_discard :]
    t0 = time.perf_counter_ns()
    b.reset()
    for chunk in b._prompt_chunks(kept):
        b._decode(chunk)
        b.cache_tokens.extend(chunk)
    return (time.perf_counter_ns() - t0) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    path = catalog.resolve(a.model)
    b = LlamaCppBackend()
    b.load(path, LoadConfig(n_ctx=a.ctx))
    n_keep = 64
    shifts, reprocs = [], []
    for r in range(a.reps):
        for which in (("s", "r") if r % 2 == 0 else ("r", "s")):
            fill(b, b.n_ctx, r)
            if which == "s":
                shifts.append(shift_ms(b, n_keep))
            else:
                reprocs.append(reprocess_ms(b, n_keep))
    s, rp = statistics.median(shifts), statistics.median(reprocs)
    print(f"{path.name}, n_ctx {b.n_ctx}, keep {n_keep}, drop half of the rest, median of {a.reps}:")
    print(f"  shift in place (incl. the next decode): {s:8.2f} ms")
    print(f"  re-process the kept window:             {rp:8.2f} ms")
    print(f"  ratio {s / rp:.3f} ({'ok' if s / rp <= 0.10 else 'ABOVE 0.10'})")
    b.close()

    print("\ndecode tokens/s by cache type (128 tokens after a 512-token prompt, median of reps):")
    base = None
    for kv in ("f16", "q8_0", "q4_0"):
        b = LlamaCppBackend()
        b.load(path, LoadConfig(n_ctx=1024, type_k=kv, type_v=kv, flash_attn="on"))
        rates = []
        for r in range(a.reps):
            rng = random.Random(r)
            prompt = [rng.randrange(10, 1000) for _ in range(512)]
            for _ in b.stream(prompt, SamplingConfig(temperature=0, max_tokens=128, ignore_eos=True)):
                pass
            rates.append(b.last_stats.decode_tokens_per_s)
        m = statistics.median(rates)
        base = base or m
        print(f"  {kv:<5} {m:8.2f} t/s  ({m / base:.3f}x f16)")
        b.close()
    return 0 if s / rp <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
