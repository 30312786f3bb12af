"""What a quantized KV cache costs in quality: q8_0 and q4_0 caches against f16.

Same weights, three caches; top-1 agreement, mean and p99 KL divergence and
perplexity on the shipped text (models/data/prose.txt), as ``quantize --eval``
computes them.

    python scripts/kv_cache_quality.py [--model smollm2] [--tokens N]
"""

from __future__ import annotations

import argparse

from localllm.measure.quality import KV_CHUNK as CHUNK
from localllm.measure.quality import kv_cache_quality
from localllm.store import resolver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="one chunk of text, as tune --quick reads (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.tokens = CHUNK
    path = resolver.resolve(a.model)
    rows = kv_cache_quality(path, ("q8_0", "q4_0"), max_tokens=a.tokens or 1 << 30)
    print(f"{path.name}: f16 cache perplexity {rows[0].reference_perplexity:.3f} on {rows[0].positions} scored tokens")
    print(f"{'cache':<6} {'PPL':>8} {'KL mean':>9} {'KL p99':>8} {'top-1':>7}")
    for r in rows:
        print(f"{r.name:<6} {r.perplexity:>8.3f} {r.kl_mean:>9.5f} {r.kl_p99:>8.4f} {100 * r.top1_agreement:>6.2f}%")


if __name__ == "__main__":
    main()
