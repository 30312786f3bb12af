"""Timed generation: prefill, then sample and decode one token at a time.

Every llama_decode is followed by llama_synchronize and a timestamp, and every
sample is stamped, so the figures match llama.cpp's own perf counters
(t_p_eval_ms / t_eval_ms). The result is a ``Generation`` whose stats exist
once it ends, however it ends (exhausted, closed early, or failed).
"""

from __future__ import annotations

import codecs
import time
from collections import deque
from collections.abc import Callable, Iterator

from localllm.engine.budgeted import Budgeted
from localllm.engine.kvcache import KVCache
from localllm.engine.model import ModelHandle
from localllm.engine.sampler import free_sampler, new_sampler, prime, sample
from localllm.engine.scorer import decode_all
from localllm.engine.tokenizer import Tokenizer
from localllm.engine_api import Generation, SamplingConfig, SpecStats, TokenEvent
from localllm.engine_api.stats import ShiftRecord, compute_stats
from localllm.speculation import Drafting, verify
from localllm.speculation.control import K_MAX

# Evaluates a prompt's leading pieces (text and images, engine.mtmd) before ``tokens``:
# called with n_keep and the shift list, returns (prefill_ns, encode_ns, images, tokens).
Prologue = Callable[[int, list[ShiftRecord]], tuple[int, int, int, int]]
# Told the prompt's tokens evaluated so far and their total, before each n_batch chunk and after the last
# (the cockpit's prefill progress, as llama-server's return_progress); called on the decoding thread.
Progress = Callable[[int, int], None]


def generate(handle: ModelHandle, tok: Tokenizer, cache: KVCache, tokens: list[int], sampling: SamplingConfig, *,
             n_keep: int, start: int, shift: bool = True, prologue: Prologue | None = None,
             progress: Progress | None = None) -> Generation:
    """Evaluate ``tokens`` after the cache and generate. With ``max_tokens`` set
    a full context shifts (keeping ``n_keep`` tokens); with -1, or ``shift``
    off, the generation stops at a full context (``stop_reason='context'``).
    ``prologue``: evaluates what comes before ``tokens`` (a prompt's images), inside
    the generation's clock, so TTFT and the stats count it. ``progress``: told
    the prefill's progress (``Progress``)."""
    return Generation(lambda out: _run(out, handle, tok, cache, tokens, sampling, n_keep, start, shift, prologue, progress))


def _run(out: Generation, handle: ModelHandle, tok: Tokenizer, cache: KVCache, tokens: list[int],
         sampling: SamplingConfig, n_keep: int, start: int, shift: bool, prologue: Prologue | None = None,
         progress: Progress | None = None) -> Iterator[TokenEvent]:
    handle.reset_perf()
    steer = handle.steer
    mark = len(steer.controller.changes) if steer is not None else 0  # this generation's thread changes start here
    sampler = new_sampler(sampling, handle.n_vocab, tok.vocab)
    seen = cache.tokens + list(tokens)
    prime(sampler, sampling, seen)  # the repeat penalty sees the conversation, not only the reply
    budget = tok.thinking_budget(sampling.reasoning_budget, seen)
    draw = Budgeted(sampler, budget, lambda s, ctx, i: sample(s, ctx, i), lambda t: tok.token_bytes(t, special=True)).sample \
        if budget is not None else (lambda ctx, i: sample(sampler, ctx, i))
    n_ctx = handle.n_ctx
    prefill_ns = decode_ns = decode_evals = 0
    token_ns: list[int] = []
    first_text_ns: int | None = None
    shifts: list[ShiftRecord] = []
    stop = "length"
    encode_ns, images, pre_tokens = 0, 0, 0
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    spec = _speculation(handle, sampling, seen)
    # sampled, not yet emitted: (token, already in the cache). A verified draft's kept tokens are; the
    # sample after them is not, and is evaluated (with the next draft, if any) once it is emitted.
    pending: deque[tuple[int, bool]] = deque()
    emitted_in_kv = False
    try:
        if prologue is not None:
            prefill_ns, encode_ns, images, pre_tokens = prologue(n_keep, shifts)
        done, total = pre_tokens, pre_tokens + len(tokens)
        for chunk in handle.prompt_chunks(tokens):
            if progress is not None:
                progress(done, total)
            cache.make_room(len(chunk), n_keep, shifts)
            prefill_ns += cache.append(chunk)
            done += len(chunk)
        if progress is not None:
            progress(done, total)
        i = 0
        pending.append((draw(handle.ctx, -1), False))
        while sampling.max_tokens < 0 or i < sampling.max_tokens:
            t, in_kv = pending.popleft()
            now = time.perf_counter_ns()
            if not sampling.ignore_eos and tok.is_eog(t):
                stop = "stop"
                pending.appendleft((t, in_kv))  # not emitted: out of the cache below, if a kept draft put it there
                break
            emitted_in_kv = in_kv
            token_ns.append(now)
            last = i == sampling.max_tokens - 1
            # A character split across tokens is emitted whole, with the token that completes it.
            text = utf8.decode(tok.reply_bytes(t), final=last)  # the format's control tokens as text (Tokenizer.shown)
            if first_text_ns is None and text:
                first_text_ns = now
            yield TokenEvent(i, t, text, now)
            i += 1
            if last:
                break
            if len(cache) >= n_ctx and (sampling.max_tokens < 0 or not shift):
                stop = "context"  # no length asked for: stop at a full context rather than shift forever
                break
            if spec is not None:
                spec.seen(t)
            if pending:
                continue  # a kept draft token is in the cache already
            draft = spec.draft(sampling.max_tokens - i - 1 if sampling.max_tokens > 0 else None,
                               None if shift and sampling.max_tokens > 0 else n_ctx - len(cache) - 1) \
                if spec is not None and (budget is None or budget.forced() is None) else []
            if not draft:
                cache.make_room(1, n_keep, shifts)
                took = cache.append([t])  # at the cache's next position (after an M-RoPE image, not its cell count)
                decode_ns += took
                decode_evals += 1
                if spec is not None:
                    spec.ctl.single(took)
                pending.append((draw(handle.ctx, -1), False))
                continue
            assert spec is not None
            cache.make_room(1 + len(draft), n_keep, shifts)
            took = decode_all(handle, [t, *draft], cache.pos())  # a row of logits for each
            decode_ns += took
            cache.record([t, *draft])
            decode_evals += 1
            given = verify(draft, lambda row: draw(handle.ctx, row))  # the kept draft tokens (in the cache), then a sample (not)
            kept = len(given) - 1
            pending.extend((x, k < kept) for k, x in enumerate(given))
            spec.ctl.verified(len(draft), kept, took)
            cache.truncate(len(cache) - (len(draft) - kept))  # the rejected draft tokens' cells
    finally:
        # the cache as without speculation: no kept draft token that was not emitted, nor the last one emitted
        ahead = sum(kv for _, kv in pending) + (emitted_in_kv and stop != "stop")
        if ahead:
            cache.truncate(len(cache) - ahead)
        free_sampler(sampler)
        if spec is not None:
            spec.finish()
        stats = compute_stats(
            start_ns=start,
            token_ns=token_ns,
            prompt_tokens=pre_tokens + len(tokens),
            prefill_ns=prefill_ns,
            decode_ns=decode_ns,
            decode_evals=decode_evals,
            load_ms=handle.info.load_ms,
            end_ns=time.perf_counter_ns(),
            stop_reason=stop,
            n_ctx=n_ctx,
            context_used=len(cache),
            shifts=shifts,
            first_text_ns=first_text_ns,
            threads=steer.controller.report(since=mark, start_ns=start) if steer is not None else None,
            images=images,
            encode_ns=encode_ns if images else None,
        )
        if spec is not None and spec.ctl.batches and decode_ns > 0:
            # a verify batch gives several tokens: the rate is the reply's tokens after the first over the decodes' time
            stats.decode_tokens_per_s = (len(token_ns) - 1) / (decode_ns / 1e9)
        out.finish(stats, SpecStats(drafted=spec.ctl.drafted, accepted=spec.ctl.accepted) if spec is not None else None)


def _speculation(handle: ModelHandle, sampling: SamplingConfig, seen: list[int]) -> Drafting | None:
    """Drafting for this generation, where it can be: asked for (``sampling.speculate``), a
    context loaded with rows of logits for a draft (``n_outputs_max``), and a cache whose last
    cells can be dropped again (not a recurrent model's state)."""
    k_max = min(K_MAX, handle.n_outputs_max - 1, handle.n_batch - 1)
    if sampling.speculate == "none" or k_max < 1 or handle.recurrent:
        return None
    return Drafting(seen, sampling.speculate, k_max, handle.replies)
