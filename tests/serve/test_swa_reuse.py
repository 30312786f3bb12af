"""A sliding-window model's prompt kept between requests (issue 59, item 7:
Claude Code's next turn must not read its 11k-token prompt again). Gemma 3's
cache keeps only the window's cells for most layers, so a prefix is usable only
while the cells before its end, a window deep, are still there: llama-server's
``pos_min`` rule (tools/server/server-context.cpp). Checked on the real model:
a new ending within reach of the window reuses the prefix and replies as a fresh
read of the whole prompt does; an ending far before the end reads it all again,
and replies the same (the first token, its log p within 0.05)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.scheduler import Job, Scheduler


@pytest.mark.slow
def test_a_sliding_window_prefix_is_reused_within_reach_and_read_again_beyond(gemma: Path) -> None:
    from localllm.engine.batch import BatchModel

    m = BatchModel()
    try:
        # a 128-token ubatch: the window's layers hold n_swa + n_ubatch cells (src/llama-kv-cache-iswa.cpp),
        # so a prompt of 900 tokens is past their reach, and the test reads a third of what 512 would need
        info = m.load(gemma, LoadConfig(n_ctx=2048, n_batch=128, n_ubatch=128, n_threads=2, flash_attn="off"), 1)
        assert info.prefix_reuse and info.n_swa == 512

        def scheduler() -> Scheduler:
            s = Scheduler(m, n_seq=1, n_ctx_seq=2048, n_batch=info.n_batch, prefix_reuse=True, max_queue=4, prefill_chunk=128,
                          metrics=ServerMetrics(), n_swa=info.n_swa)
            s.start()
            return s

        def ask(sched: Scheduler, tokens: list[int]) -> tuple[Job, tuple[int, float]]:
            out: list[tuple[int, float]] = []
            done = threading.Event()

            def emit(kind: str, payload: object) -> None:
                if kind == "logprob" and not out:
                    out.append((payload[0], payload[2]))  # type: ignore[index]  # the first token and its log p
                elif kind in ("done", "error"):
                    done.set()

            job = Job(tokens=tokens, sampling=SamplingConfig(temperature=0, max_tokens=1), max_tokens=1, emit=emit, logprobs=0)
            assert sched.submit(job)
            assert done.wait(300)
            return job, out[0]

        story = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(100))
        base = m.tok.tokenize(story)
        assert len(base) > 512 + 128 + 200  # past the window's cells from position 200 on
        near = base + m.tok.tokenize(" Which colour is item 7? Answer:", add_special=False)
        far = base[:200] + m.tok.tokenize(" Which colour is item 7? Answer:", add_special=False)
        sched = scheduler()
        first, _ = ask(sched, base)
        assert first.n_cached == 0
        got_near, reply_near = ask(sched, near)
        assert got_near.n_cached == len(base)  # within the window's reach: only the new ending was read
        got_far, reply_far = ask(sched, far)
        assert got_far.n_cached == 0  # the cells before position 200 are gone: read again
        sched.stop()
        for tokens, (tok, lp) in ((near, reply_near), (far, reply_far)):  # the reply a fresh read of the whole prompt gives
            m.seq_rm(0)
            fresh = scheduler()
            job, (tok2, lp2) = ask(fresh, tokens)
            fresh.stop()
            # the same first token, its log p within what another batch split moves it (cells missing
            # from the window would move it by nats)
            assert job.n_cached == 0 and tok == tok2 and abs(lp - lp2) < 0.05, (tok, lp, tok2, lp2)
    finally:
        m.close()
