"""The greedy fast path (engine/sampler.Greedy): llama.cpp's greedy sampler's
picks, read as an argmax of the logits row.

On SmolLM2 the picks are compared with llama.cpp's own greedy sampler row by
row, for several sequences decoded in one batch (each row is read at its own
batch index); the tie and NaN rules are those of ``llama_sampler_greedy_apply``
(src/llama-sampler.cpp), checked on arrays.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localllm.engine.batch import BatchModel
from localllm.engine.sampler import Greedy, first_max, free_sampler, new_sampler, plain_greedy, sample
from localllm.engine_api import LoadConfig, SamplingConfig


def test_first_max_is_llama_cpps_rule() -> None:
    assert first_max(np.array([0.5, 2.0, 1.0, 2.0], dtype=np.float32)) == 1  # a tie: the first, as a strict '>' keeps it
    assert first_max(np.array([-np.inf, -np.inf], dtype=np.float32)) == 0
    assert first_max(np.array([1.0, np.inf, np.inf], dtype=np.float32)) == 1
    assert first_max(np.array([1.0, np.nan, 3.0], dtype=np.float32)) is None  # left to llama.cpp's sampler


def test_only_a_chain_of_greedy_alone_takes_the_fast_path() -> None:
    assert plain_greedy(SamplingConfig(temperature=0))
    assert not plain_greedy(SamplingConfig(temperature=0.7))
    assert not plain_greedy(SamplingConfig(temperature=0, repeat_penalty=1.1))
    assert not plain_greedy(SamplingConfig(temperature=0, presence_penalty=0.5))
    assert not plain_greedy(SamplingConfig(temperature=0, logit_bias=((5, -100.0),)))
    assert not plain_greedy(SamplingConfig(temperature=0, grammar='root ::= "a"'))


@pytest.mark.slow
def test_picks_equal_llama_cpps_greedy_sampler_on_every_row(smollm2: Path) -> None:
    m = BatchModel()
    m.load(smollm2, LoadConfig(n_ctx=512, n_threads=2), 3)
    chain = new_sampler(SamplingConfig(temperature=0), m.tok.n_vocab, m.tok.vocab)
    fast = m.new_sampler(SamplingConfig(temperature=0))
    try:
        assert isinstance(fast, Greedy)
        prompts = [m.tok.tokenize(p) for p in ("The capital of France is", "def fib(n):", "1, 2, 3,")]
        entries = [(t, k, s, k == len(p) - 1) for s, p in enumerate(prompts) for k, t in enumerate(p)]
        rows = [i for i, e in enumerate(entries) if e[3]]
        pos = [len(p) for p in prompts]
        m.decode(entries)
        picks: list[list[int]] = [[] for _ in prompts]
        for _ in range(24):
            step = []
            for s, i in enumerate(rows):
                tok = m.sample(fast, i)
                assert tok == sample(chain, m.ctx, i)
                picks[s].append(tok)
                step.append((tok, pos[s], s, True))
                pos[s] += 1
            m.decode(step[::-1])  # rows in another order than the sequences: each read at its own index
            rows = [len(prompts) - 1 - s for s in range(len(prompts))]
        assert len({tuple(p) for p in picks}) == 3  # three different replies: the rows were not mixed up
    finally:
        free_sampler(chain)
        m.free_sampler(fast)
        m.close()
