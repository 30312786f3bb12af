"""What a quantized KV cache costs in quality: q8_0 and q4_0 caches against f16.

Same weights, three caches; top-1 agreement, mean and p99 KL divergence and
perplexity on the shipped text (models/data/prose.txt), as ``quantize --eval``
computes them.

    python scripts/kv_cache_quality.py [--model smollm2] [--tokens N]
"""

from __future__ import annotations

import argparse

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig
from localllm.measure.quality import compare, eval_text
from localllm.store import resolver

CHUNK = 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="two chunks of text (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.tokens = 2 * CHUNK
    path = resolver.resolve(a.model)
    backends = {}
    for kv in ("f16", "q8_0", "q4_0"):
        b = LlamaCppBackend()
        b.load(path, LoadConfig(n_ctx=CHUNK, n_batch=CHUNK, n_ubatch=CHUNK, n_outputs_max=0, type_k=kv, type_v=kv, flash_attn="on"))
        backends[kv] = b
    tokens = backends["f16"].tokenize(eval_text())[: a.tokens]
    rows = compare(backends["f16"].logits, {k: backends[k].logits for k in ("q8_0", "q4_0")}, tokens, chunk=CHUNK, bos=backends["f16"].bos_token())
    print(f"{path.name}: f16 cache perplexity {rows[0].reference_perplexity:.3f} on {rows[0].positions} scored tokens")
    print(f"{'cache':<6} {'PPL':>8} {'KL mean':>9} {'KL p99':>8} {'top-1':>7}")
    for r in rows:
        print(f"{r.name:<6} {r.perplexity:>8.3f} {r.kl_mean:>9.5f} {r.kl_p99:>8.4f} {100 * r.top1_agreement:>6.2f}%")
    for b in backends.values():
        b.close()


if __name__ == "__main__":
    main()
