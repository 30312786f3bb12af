"""Speculative decoding: guess several tokens cheaply, check them in one batch.

Decode is memory-bound: one token or eight cost nearly the same pass over the
weights. So a drafter proposes ``k`` tokens, the model evaluates the current
token plus the draft in one batch, and every draft token the model would have
picked itself is accepted at once. Greedy (temperature 0) only: the output is
what greedy decoding gives, up to the floating-point differences between a
batched and a one-token evaluation (which can flip a near-tie), just sooner
when the drafts are good.

Drafters:
- ``PromptLookup``: find the latest earlier occurrence of the last few tokens
  in the context and propose what followed (copy-heavy tasks: edits, quotes).
- ``DraftModel``: a smaller model with the same vocabulary proposes greedily.
Off by default; ``run --speculate lookup`` or ``--draft MODEL`` turns it on.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from localllm.engine_api import Engine, Generation, SpecStats, TokenEvent
from localllm.engine_api.stats import GenerationStats, compute_stats


class Drafter(Protocol):
    def propose(self, context: Sequence[int], k: int) -> list[int]: ...


@dataclass
class PromptLookup:
    """Prompt-lookup decoding: n-gram match against the context itself."""

    max_ngram: int = 3
    min_ngram: int = 1

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = list(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= n:
                continue
            tail = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start : start + n] == tail:
                    follow = ctx[start + n : start + n + k]
                    if follow:
                        return follow
        return []


class DraftModel:
    """A second (smaller) model with the same vocabulary, drafting greedily."""

    def __init__(self, backend: Engine) -> None:
        self.backend = backend

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        b = self.backend
        common = 0
        for a, c in zip(b.cache_tokens, context):
            if a != c:
                break
            common += 1
        common = min(common, len(context) - 1)
        b.truncate(common)
        if len(context) - 1 > common:
            b.prefill(list(context[common:-1]))
        out: list[int] = []
        nxt = b.verify([context[-1]]).predictions[-1]
        for _ in range(k):
            out.append(nxt)
            nxt = b.verify([nxt]).predictions[-1]
        return out



def generate(engine: Engine, prompt_tokens: Sequence[int], drafter: Drafter, *, max_tokens: int, k: int = 8,
             stop_at_eog: bool = True) -> Generation:
    """Greedy generation with drafts; the ``Generation`` carries the stats and
    the ``SpecStats`` (drafted, accepted) once it ends."""
    return Generation(lambda out: _run(out, engine, list(prompt_tokens), drafter, max_tokens, k, stop_at_eog))


def _run(out: Generation, engine: Engine, prompt: list[int], drafter: Drafter, max_tokens: int, k: int,
         stop_at_eog: bool) -> Iterator[TokenEvent]:
    start = time.perf_counter_ns()
    engine.reset()
    spec = SpecStats()
    prefill_ns = int(engine.prefill(prompt[:-1]) * 1e6) if len(prompt) > 1 else 0
    # The last prompt token goes through verify, which gives the first prediction.
    first = engine.verify([prompt[-1]])
    prefill_ns += first.ns
    nxt = first.predictions[-1]
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    token_ns: list[int] = []
    decode_ns = evals = 0
    emitted = 0
    k_now = min(4, k)
    stop = "length"
    n_ctx = engine.n_ctx
    try:
        while emitted < max_tokens:
            if stop_at_eog and engine.is_eog(nxt):
                stop = "stop"
                break
            now = time.perf_counter_ns()
            token_ns.append(now)
            yield TokenEvent(emitted, nxt, utf8.decode(engine.token_bytes(nxt)), now)
            emitted += 1
            if emitted >= max_tokens or engine.context_used + k + 2 >= n_ctx:
                break
            draft = drafter.propose(engine.cache_tokens + [nxt], k_now)[: max(0, min(k_now, max_tokens - emitted))]
            base = engine.context_used
            checked = engine.verify([nxt] + draft)
            preds = checked.predictions
            decode_ns += checked.ns
            evals += 1
            spec.drafted += len(draft)
            accepted = 0
            hit_eog = False
            for i, d in enumerate(draft):
                if preds[i] != d:
                    break
                if stop_at_eog and engine.is_eog(d):
                    hit_eog = True
                    break
                accepted += 1
                now = time.perf_counter_ns()
                token_ns.append(now)
                yield TokenEvent(emitted, d, utf8.decode(engine.token_bytes(d)), now)
                emitted += 1
                if emitted >= max_tokens:
                    break
            spec.accepted += accepted
            # Adapt the draft length: a batch costs more than one token, so draft
            # long only while drafts are being accepted.
            if draft:
                k_now = min(k, k_now + 2) if accepted == len(draft) else max(1, k_now // 2) if accepted == 0 else k_now
            engine.truncate(base + 1 + accepted)
            if hit_eog:
                stop = "stop"
                break
            nxt = preds[accepted]
    finally:
        n = len(token_ns)
        info = engine.info
        stats: GenerationStats = compute_stats(
            start_ns=start, token_ns=token_ns, prompt_tokens=len(prompt), prefill_ns=prefill_ns,
            decode_ns=decode_ns, decode_evals=evals, load_ms=info.load_ms if info else 0.0,
            end_ns=time.perf_counter_ns(), stop_reason=stop, n_ctx=n_ctx, context_used=engine.context_used,
        )
        # The effective decode rate: every emitted token after the first, over the
        # wall time from the first token to the last, so drafting (a draft
        # model's own decodes) counts, not only the checking batches.
        span_ns = token_ns[-1] - token_ns[0] if n > 1 else 0
        stats.decode_tokens_per_s = (n - 1) / (span_ns / 1e9) if span_ns > 0 else None
        out.finish(stats, spec)
