"""Soak: many chat turns on a small context, with context shifts, through
``localllm.chat.session.ChatSession`` on the real engine. Does memory stay flat and does
every turn succeed?

Resident memory (psutil) is read after a warm-up (allocators, llama.cpp's
graph and sampler buffers settle in the first turns) and at the end; the run
passes when it grew by at most 5%, no turn failed, and the context shifted (a
soak that never shifted did not test shifting).

    python scripts/soak_chat.py [--model smollm2] [--turns 1000] [--ctx 256] [--tokens 24]
    python scripts/soak_chat.py --quick        # 20 turns, for CI
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = (
    "Name a fruit.", "What is two plus two?", "Say hello in French.", "Give me a colour.",
    "What is the capital of Spain?", "Write one word about the sea.", "Count to three.",
    "Name an animal that flies.", "What day comes after Monday?", "Tell me a short fact about the Moon.",
    "Suggest a name for a cat.", "What is water made of?",
)
MB = 1e6


def rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model name or path (default: the built-in SmolLM2)")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=None, help="turns before the first memory reading (default: 5%% of the turns, at least 10)")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=24, help="reply length cap per turn")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-growth", type=float, default=5.0, help="allowed resident-memory growth after warm-up, in percent")
    ap.add_argument("--quick", action="store_true", help="20 turns with 8-token replies (a CI check that the soak runs and shifts)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = ap.parse_args(argv)
    if a.quick:
        a.turns, a.tokens = 20, 8
    warmup = a.warmup if a.warmup is not None else max(10, a.turns // 20)
    if a.turns <= warmup:
        ap.error(f"--turns must exceed the warm-up ({warmup})")

    from localllm.chat.session import ChatSession
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig, SamplingConfig
    from localllm.store import resolver

    path = resolver.resolve(a.model)
    backend = LlamaCppBackend()
    backend.load(path, LoadConfig(n_ctx=a.ctx, n_threads=a.threads))
    chat = ChatSession(
        backend,
        system_prompt="You are a helpful assistant. Answer briefly.",
        sampling=SamplingConfig(temperature=0.8, seed=a.seed, max_tokens=a.tokens),
        completion=not backend.has_chat_template,
    )
    failures: list[str] = []
    generated = 0
    rss_warm = None
    samples: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    for turn in range(1, a.turns + 1):
        text = f"{PROMPTS[turn % len(PROMPTS)]} (question {turn})"
        try:
            for _ in chat.send(text):
                pass
            generated += chat.turns[-1].stats.generated_tokens
        except Exception as exc:  # noqa: BLE001 - a soak counts failures, it does not stop at one
            failures.append(f"turn {turn}: {type(exc).__name__}: {exc}")
        if turn == warmup:
            rss_warm = rss()
            samples.append((turn, rss_warm))
        if not a.json and (turn % max(a.turns // 10, 1) == 0 or turn == warmup):
            rate = turn / (time.perf_counter() - t0)
            print(f"turn {turn:5d}: rss {rss() / MB:.1f} MB · context {chat.context_used}/{backend.n_ctx} · shifts {len(chat.shifts)}"
                  f" · failed {len(failures)} · {rate:.2f} turns/s", flush=True)
        if turn % 50 == 0:
            samples.append((turn, rss()))
    elapsed = time.perf_counter() - t0
    rss_end = rss()
    backend.close()
    assert rss_warm is not None
    growth = 100 * (rss_end - rss_warm) / rss_warm
    ok = growth <= a.max_growth and not failures and len(chat.shifts) > 0
    result = {
        "model": path.name, "turns": a.turns, "warmup_turns": warmup, "n_ctx": a.ctx, "max_tokens": a.tokens,
        "failed_turns": len(failures), "failures": failures[:10], "context_shifts": len(chat.shifts),
        "generated_tokens": generated, "seconds": round(elapsed, 1), "turns_per_s": round(a.turns / elapsed, 2),
        "rss_after_warmup_bytes": rss_warm, "rss_end_bytes": rss_end, "rss_growth_percent": round(growth, 2),
        "rss_max_bytes": max(r for _, r in samples + [(a.turns, rss_end)]), "pass": ok,
    }
    if a.json:
        print(json.dumps(result))
    else:
        for f in failures[:10]:
            print(f"  {f}")
        print(f"soak {path.name} · {a.turns} turns at --ctx {a.ctx}, replies ≤{a.tokens} tokens · {generated} tokens generated"
              f" · {len(chat.shifts)} context shifts · {len(failures)} failed turns · {elapsed:.0f} s ({a.turns / elapsed:.2f} turns/s)")
        print(f"resident memory: {rss_warm / MB:.1f} MB after warm-up (turn {warmup}) → {rss_end / MB:.1f} MB at the end"
              f" ({growth:+.2f}%, limit +{a.max_growth:g}%; max {result['rss_max_bytes'] / MB:.1f} MB): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
