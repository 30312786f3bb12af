"""Decode speed by thread count, measured side by side: what ``doctor`` names
as the count to use on this machine now (issue 50 item 4).

llama.cpp waits at a barrier after every op for its slowest thread, so on a
machine where another program holds a core, all cores can be slower than
fewer (measured here: 41 t/s on 2 threads against 68 t/s on 1 with one core
taken). Counts are alternated, so a load that comes or goes during the
measurement touches each count alike; each count's figure is its median.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from localllm.engine_api import SamplingConfig
from localllm.measure.doctor import Action

WORTH = 1.10  # a count this much faster than the start is worth naming: more than one reply varies from the next


def decode_by_threads(backend, counts: Iterable[int], *, gen_tokens: int = 24, rounds: int = 2, chat: bool = True) -> dict[int, float]:
    """Decode tokens/s at each count (the engine pinned to it: ``pinned_threads``),
    the counts alternated ``rounds`` times; the median of each count's runs."""
    wanted = sorted(set(counts))
    runs: dict[int, list[float]] = {n: [] for n in wanted}
    ask = SamplingConfig(temperature=0, max_tokens=gen_tokens, ignore_eos=True)
    for _ in range(rounds):
        for n in wanted:
            with backend.pinned_threads(n):
                stats = backend.stream("Hello", ask, chat=chat).drain()
            if stats.decode_tokens_per_s:
                runs[n].append(stats.decode_tokens_per_s)
    return {n: statistics.median(r) for n, r in runs.items() if r}


def thread_action(rates: dict[int, float], start: int, busy: str | None) -> Action | None:
    """``--threads N`` when a count decoded ``WORTH`` faster than ``start`` (the count
    the engine starts from), with both figures; ``busy``: what else used the CPU."""
    if start not in rates or not rates:
        return None
    best = max(rates, key=lambda n: rates[n])
    gain = rates[best] / rates[start]
    if best == start or gain < WORTH:
        return None
    s = "" if start == 1 else "s"
    why = (f"{busy}: fewer threads wait less for a core another program holds" if busy and best < start
           else "measured here, the counts alternated")
    return Action(
        action=f"--threads {best} (the default adaptive count probes toward it as it decodes; this fixes it)",
        expected=f"decode x{gain:.2f}: {rates[best]:.1f} t/s on {best} against {rates[start]:.1f} t/s on {start} thread{s}",
        why=why, gain=gain, basis="measured")
