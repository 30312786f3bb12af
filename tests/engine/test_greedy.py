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
from localllm.engine.sampler import Greedy, first_max, first_max_rows, free_sampler, new_sampler, plain_greedy, sample
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


def _rows_at(monkeypatch, rows: np.ndarray, index_to_row: dict[int, int]) -> None:
    """llama_get_logits_ith over ``rows`` (one buffer, as llama.cpp's output buffer):
    batch entry i -> row index_to_row[i]."""
    import ctypes

    from localllm.engine import sampler as sampler_module

    base = rows.ctypes.data
    stride = rows.shape[1] * 4

    def get(ctx, i):
        return ctypes.cast(base + index_to_row[i] * stride, ctypes.POINTER(ctypes.c_float))

    monkeypatch.setattr(sampler_module.llama_cpp, "llama_get_logits_ith", get)


def test_rows_of_one_step_follow_first_max_row_by_row(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((5, 1000)).astype(np.float32)
    rows[1, 10] = rows[1, 700] = 9.0  # a tie: the first
    rows[2, 3] = np.nan  # left to llama.cpp's sampler
    rows[3, :] = -np.inf
    rows[4, 999] = np.inf
    _rows_at(monkeypatch, rows, {0: 4, 5: 0, 9: 1, 12: 2, 20: 3})  # batch entries read in another order than the rows
    picks = first_max_rows(object(), [12, 0, 20, 9, 5], 1000)
    assert picks == [None, 999, 0, 10, int(rows[0].argmax())]
    assert picks == [first_max(rows[r]) for r in (2, 4, 3, 1, 0)]


@pytest.mark.slow
def test_one_steps_greedy_rows_are_llama_cpps_picks_beside_other_chains(smollm2: Path) -> None:
    """BatchModel.sample_all (serve's step): the greedy rows read together, a seeded
    chain's row by its own sampler, every greedy pick llama.cpp's greedy sampler's."""
    m = BatchModel()
    m.load(smollm2, LoadConfig(n_ctx=512, n_threads=2), 4)
    chain = new_sampler(SamplingConfig(temperature=0), m.tok.n_vocab, m.tok.vocab)
    samplers = [m.new_sampler(SamplingConfig(temperature=0)) for _ in range(3)]
    seeded = m.new_sampler(SamplingConfig(temperature=0.8, seed=3))
    twin = new_sampler(SamplingConfig(temperature=0.8, seed=3), m.tok.n_vocab, m.tok.vocab)  # the same chain, sampled alone
    try:
        prompts = [m.tok.tokenize(p) for p in ("The capital of France is", "def fib(n):", "1, 2, 3,", "Once upon a time")]
        entries = [(t, k, s, k == len(p) - 1) for s, p in enumerate(prompts) for k, t in enumerate(p)]
        rows = [i for i, e in enumerate(entries) if e[3]]
        pos = [len(p) for p in prompts]
        m.decode(entries)
        order = [3, 1, 0, 2]  # the seeded sequence's row between greedy ones
        for _ in range(12):
            picks = m.sample_all([(samplers[s] if s < 3 else seeded, rows[s]) for s in order])
            for s, tok in zip(order, picks):
                if s < 3:
                    assert tok == sample(chain, m.ctx, rows[s])
                else:
                    assert tok == sample(twin, m.ctx, rows[s])
            step = [(tok, pos[s], s, True) for s, tok in zip(order, picks)]
            for s in order:
                pos[s] += 1
            m.decode(step)
            rows = [order.index(s) for s in range(4)]
    finally:
        free_sampler(chain)
        free_sampler(twin)
        for smp in (*samplers, seeded):
            m.free_sampler(smp)
        m.close()
