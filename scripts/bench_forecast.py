"""The TTFT forecast against the measured TTFT, on SmolLM2, prompts of 512-4,096 tokens.

As the cockpit would: each run's forecast is made before it from the runs
measured earlier in the same session (``localllm.forecast.Forecaster``, fed each
run's stats), never from the run itself. The sizes alternate (up, then down,
round after round) so that neither the fit nor the machine's drift favours one
size. A warm-up run at the smallest size is measured and fed to the forecaster
but not scored (a session's first prompt has no forecast: n/a). Each run is a
fresh prompt (the cache cleared), the first token generated and timed.
Target: the median of forecast / measured within 0.75-1.25.

    python scripts/bench_forecast.py [--model smollm2] [--rounds 3] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.engine import LlamaCppBackend  # noqa: E402
from localllm.engine_api import LoadConfig, SamplingConfig  # noqa: E402
from localllm.forecast import Forecaster  # noqa: E402
from localllm.measure.quality import eval_text  # noqa: E402
from localllm.store import resolver  # noqa: E402

SIZES = (512, 1024, 2048, 4096)
QUICK_SIZES = (32, 64, 128)
TARGET = (0.75, 1.25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="prompts of 32-128 tokens, two rounds (CI: checks that it completes and prints its figures)")
    a = ap.parse_args()
    sizes = QUICK_SIZES if a.quick else SIZES
    rounds = 2 if a.quick else a.rounds
    path = resolver.resolve(a.model)
    b = LlamaCppBackend()
    b.load(path, LoadConfig(n_ctx=max(sizes) + 256, n_threads=a.threads))
    words = b.tokenize(eval_text(), add_special=False)
    tokens = (words * (max(sizes) // len(words) + 1))[: max(sizes)]
    sampling = SamplingConfig(temperature=0, max_tokens=1, ignore_eos=True)
    fc = Forecaster()

    def measure(n: int) -> float:
        start = time.perf_counter_ns()
        gen = b.stream(tokens[:n], sampling, start_ns=start)
        for _ in gen:
            pass
        stats = gen.stats
        assert stats is not None and stats.ttft_ms is not None
        fc.observe_stats(stats, prefix=0)
        return stats.ttft_ms

    measure(sizes[0])  # warm-up: measured and fed in, not scored
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes if r % 2 == 0 else reversed(sizes):
            forecast = fc.predict(n).ttft_ms
            measured = measure(n)
            assert forecast is not None  # the warm-up was measured
            runs[n].append((forecast, measured))
    b.close()
    a_ms, b_ms = fc.coefficients() or (0.0, 0.0)
    print(f"{path.name}, {rounds} round(s) of alternating sizes, threads {a.threads or 'default'}; "
          f"model now t(n) = {a_ms:.4f}·n + {b_ms:.3g}·n²/2 ms")
    print(f"{'tokens':>7} {'forecast ms':>12} {'measured ms':>12} {'ratio':>7}")
    ratios: list[float] = []
    for n in sizes:
        rs = [f / m for f, m in runs[n]]
        ratios += rs
        print(f"{n:>7} {statistics.median(f for f, _ in runs[n]):>12.1f} {statistics.median(m for _, m in runs[n]):>12.1f} "
              f"{statistics.median(rs):>7.3f}")
        print(f"forecast / measured TTFT at {n} tokens: {statistics.median(rs):.3f} (runs: {', '.join(f'{x:.2f}' for x in rs)})")
    med = statistics.median(ratios)
    ok = TARGET[0] <= med <= TARGET[1]
    print(f"median forecast / measured TTFT over {len(ratios)} runs (target {TARGET[0]}-{TARGET[1]}): {med:.3f} "
          f"{'ok' if ok else 'OUTSIDE THE TARGET'}{' (not judged: --quick)' if a.quick else ''}")
    return 0 if ok or a.quick else 1


if __name__ == "__main__":
    raise SystemExit(main())
