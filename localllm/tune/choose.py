"""Which candidate of a stage wins: the one a typical request finishes soonest
on, if it beats the incumbent by more than the runs vary, and if the plan and
the quality bound allow it.

A request here is each measured prompt followed by a ``REPLY_TOKENS`` reply: its
time weighs prefill and decode as a chat turn does, so neither a prefill gain
that costs decode nor the reverse wins unseen. Each figure is the best of the
candidate's runs, which were alternated with the others' (A B A B), so a load
that came and went touched every candidate alike, and the run it spared counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localllm.tune.candidates import Setting

REPLY_TOKENS = 128  # bench's default reply: a chat turn's
MARGIN = 0.03  # a challenger must save over 3% of the request time: runs of one setting vary by about that on a quiet machine
# The default bound on a quantized KV cache's mean KL against f16 (``--max-kl``): between what
# a q8_0 cache costs a small model (0.008-0.017 measured on SmolLM2 135M, by the number of
# tokens scored) and what q4_0 costs (0.16-0.25): q8_0 may be chosen for speed, q4_0 not.
MAX_KL = 0.02


@dataclass(frozen=True)
class Run:
    """One measurement of one candidate: tokens/s by prompt length (None: not measured)."""

    prefill: dict[int, float | None]
    decode: dict[int, float | None]


@dataclass
class Result:
    """A candidate's runs, what the plan says of it, and its quality cost."""

    setting: Setting
    fits: bool = True
    memory: tuple[int, int] | None = None  # planned (GPU, CPU) bytes, as ``localllm plan`` shows them
    why_not: str | None = None  # the plan's sentence when it does not fit as asked
    kl_mean: float | None = None  # against an f16 cache (None: not measured, or f16 itself with ``reference``)
    kl_p99: float | None = None
    top1: float | None = None
    reference: bool = False  # the f16 cache the others' quality is measured against
    runs: list[Run] = field(default_factory=list)

    def prefill(self) -> dict[int, float | None]:
        return _best([r.prefill for r in self.runs])

    def decode(self) -> dict[int, float | None]:
        return _best([r.decode for r in self.runs])

    def request_s(self) -> float | None:
        """Seconds for each measured prompt plus a ``REPLY_TOKENS`` reply, summed; None when a figure is missing."""
        pp, tg = self.prefill(), self.decode()
        if not pp or set(pp) != set(tg):
            return None
        total = 0.0
        for p in pp:
            a, b = pp[p], tg[p]
            if a is None or b is None or a <= 0 or b <= 0:
                return None
            total += p / a + REPLY_TOKENS / b
        return total

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.setting.to_dict(), "fits": self.fits, "why_not": self.why_not,
                "memory_bytes": None if self.memory is None else {"gpu": self.memory[0], "cpu": self.memory[1],
                                                                   "total": sum(self.memory)},
                "prefill_tokens_per_s": {str(k): v for k, v in self.prefill().items()} or None,
                "decode_tokens_per_s": {str(k): v for k, v in self.decode().items()} or None,
                "request_s": self.request_s(), "runs": len(self.runs),
                "kl_mean": 0.0 if self.reference else self.kl_mean, "kl_p99": 0.0 if self.reference else self.kl_p99,
                "top1_agreement": 1.0 if self.reference else self.top1}


def _best(rows: Sequence[dict[int, float | None]]) -> dict[int, float | None]:
    """Each prompt length's fastest run. Another program only ever slows a run down, so
    the best of a candidate's runs is the one least touched by it: with two runs the
    median (their mean) carried half of a slowdown that hit one of them (measured
    here: decode 37.8 t/s against 80 for a run another program hit)."""
    keys = sorted({k for r in rows for k in r})
    out: dict[int, float | None] = {}
    for k in keys:
        got = [v for r in rows if (v := r.get(k)) is not None]
        out[k] = max(got) if got else None
    return out


def eligible(r: Result, max_kl: float, incumbent: Setting | None = None) -> str | None:
    """Why ``r`` may not win (None: it may): it does not fit as asked, it was not
    measured, or it changes the cache to a type whose quality cost is unknown or
    above ``max_kl`` (a cache type the incumbent has already is no change)."""
    if not r.fits:
        return "does not fit: " + (r.why_not or "the plan refuses it")
    if r.request_s() is None:
        return "not measured"
    if r.setting.kv_type != "f16" and not r.reference and (incumbent is None or r.setting.kv_type != incumbent.kv_type):
        if r.kl_mean is None:
            return "quality not measured"
        if r.kl_mean > max_kl:
            return f"KL {r.kl_mean:.4f} over {max_kl:g}"
    return None


def winner(results: Sequence[Result], *, max_kl: float = MAX_KL, margin: float = MARGIN) -> Result:
    """The stage's winner: the incumbent (``results[0]``) unless an eligible
    challenger's request time is over ``margin`` shorter. An incumbent that was
    not measured (interrupted) stays: nothing says another is faster."""
    incumbent = results[0]
    base = incumbent.request_s()
    if base is None:
        return incumbent
    best = incumbent
    for r in results[1:]:
        t = r.request_s()
        if eligible(r, max_kl, incumbent.setting) is None and t is not None and t < base * (1 - margin) and t < (best.request_s() or base):
            best = r
    return best
