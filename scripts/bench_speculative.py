"""Speculative decoding, with and without, side by side: a copy-heavy task
(editing a given text) and a free-form one. Reports ITL (mean time per output
token, TPOT, and p50) and the acceptance rate; greedy, same prompt, alternating.

    python scripts/bench_speculative.py [--model smollm2] [--draft MODEL] [--reps 3] [--tokens 160]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.chat.speculative import DraftModel, PromptLookup, generate  # noqa: E402
from localllm.engine import LlamaCppBackend  # noqa: E402
from localllm.engine_api import LoadConfig, SamplingConfig  # noqa: E402
from localllm.store import resolver  # noqa: E402

TEXT = ("The lighthouse stood on the northern cape, and its keeper, an old sailor named Tobias, "
        "climbed the ninety steps every evening to light the lamp. He kept a log of every ship that passed, "
        "the weather, and the colour of the sea at dusk. ")
TASKS = {
    "copy-heavy (edit a given text)": f"Rewrite this text, changing only 'Tobias' to 'Martha' and 'he' to 'she':\n\n{TEXT * 2}",
    "free-form (write something new)": "Write a short story about a lighthouse keeper.",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="one repetition, few tokens (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.tokens = 1, 24
    b = LlamaCppBackend()
    b.load(resolver.resolve(a.model), LoadConfig(n_ctx=2048, n_outputs_max=a.k + 1))
    drafter = PromptLookup()
    label = "prompt lookup"
    if a.draft:
        d = LlamaCppBackend()
        d.load(resolver.resolve(a.draft), LoadConfig(n_ctx=2048, n_outputs_max=a.k + 1))
        drafter, label = DraftModel(d), f"draft {a.draft}"
    print(f"{b.info.path.name}, greedy, {a.tokens} tokens, k={a.k}, {label}, median of {a.reps}")
    for name, prompt in TASKS.items():
        tokens = b.prompt_tokens(prompt, chat=True)
        plain, spec, acc = [], [], []
        for r in range(a.reps):
            for which in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
                if which == "plain":
                    s = b.stream(tokens, SamplingConfig(temperature=0, max_tokens=a.tokens, ignore_eos=True)).drain()
                    plain.append((s.tpot_ms, s.itl_ms.p50))
                else:
                    run = generate(b, tokens, drafter, max_tokens=a.tokens, k=a.k, stop_at_eog=False)
                    s = run.drain()
                    spec.append((s.tpot_ms, s.itl_ms.p50))
                    acc.append(run.spec.acceptance)
        pt, st = statistics.median(x[0] for x in plain), statistics.median(x[0] for x in spec)
        print(f"  {name}:")
        print(f"    without: TPOT {pt:6.2f} ms, ITL p50 {statistics.median(x[1] for x in plain):6.2f} ms")
        print(f"    with:    TPOT {st:6.2f} ms, ITL p50 {statistics.median(x[1] for x in spec):6.2f} ms, "
              f"acceptance {100 * statistics.median(acc):.0f}%  ->  {pt / st:.2f}x tokens per second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
