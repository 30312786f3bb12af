"""llama-server's ``post_sampling_probs`` (engine/logprobs.post_sampling_probs):
the distribution the samplers leave, derived in numpy, against llama.cpp's own
samplers applied to the same logits row (top-k, top-p, min-p and temperature
chained with llama_sampler_apply, then the softmax of what is left)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localllm.engine.batch import BatchModel
from localllm.engine.logprobs import logits_row
from localllm.engine_api import LoadConfig, SamplingConfig

CASES = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=0, top_p=0.5, min_p=0.0),
         SamplingConfig(temperature=1.5, top_k=10, top_p=1.0, min_p=0.1, logit_bias=((28, 5.0), (355, -100.0)))]


def _llama_cpps(ctx: object, i: int, n_vocab: int, s: SamplingConfig) -> dict[int, float]:
    """What llama.cpp's chain keeps of row ``i``, and the softmax of it."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        if s.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(s.logit_bias))(*(llama_cpp.llama_logit_bias(t, b) for t, b in s.logit_bias))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(s.logit_bias), biases))
        if s.top_k > 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(s.top_k))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(s.temperature))
        row = logits_row(ctx, i, n_vocab)
        data = (llama_cpp.llama_token_data * n_vocab)(*(llama_cpp.llama_token_data(t, float(row[t]), 0.0) for t in range(n_vocab)))
        arr = llama_cpp.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
        kept = [(arr.data[k].id, arr.data[k].logit) for k in range(arr.size)]
    finally:
        llama_cpp.llama_sampler_free(chain)
    z = np.array([v for _, v in kept], dtype=np.float64)
    p = np.exp(z - z.max())
    return {t: float(v) for (t, _), v in zip(kept, p / p.sum()) if v > 0}


@pytest.mark.slow
def test_the_probabilities_are_llama_cpps_samplers(smollm2: Path) -> None:
    m = BatchModel()
    m.load(smollm2, LoadConfig(n_ctx=256, n_threads=2), 1)
    try:
        prompt = m.tok.tokenize("Today was the day. Today I would finally become a")
        m.decode([(t, k, 0, k == len(prompt) - 1) for k, t in enumerate(prompt)])
        i, n = len(prompt) - 1, m.tok.n_vocab
        for s in CASES:
            want = _llama_cpps(m.ctx, i, n, s)
            best = max(want, key=lambda t: want[t])
            p, top = m.post_probs(i, best, len(want) + 5, s)
            assert len(want) > 1 and [t for t, _ in top] == sorted(want, key=lambda t: (-want[t], t))
            assert p == pytest.approx(want[best], rel=1e-5) and all(v == pytest.approx(want[t], rel=1e-5, abs=1e-9) for t, v in top)
            assert m.post_probs(i, 355, 3, s)[0] == (0.0 if 355 not in want else pytest.approx(want[355]))
        assert m.post_probs(i, 7, 10, SamplingConfig(temperature=0)) == (1.0, [(7, 1.0)])  # greedy keeps its pick alone
    finally:
        m.close()
