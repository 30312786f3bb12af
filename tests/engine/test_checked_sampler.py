"""Sample then check (engine/checked_sampler.py) against the grammar-first chain, on SmolLM2.

Greedy decoding must give the very tokens the grammar-first chain gives (the
check only skips filtering the vocabulary when the pick is allowed), and the
prompt is one where the model's own pick breaks the grammar at once (it opens
a code fence), so the resample path is exercised, not only the accept path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine import grammar
from localllm.engine.batch import BatchModel
from localllm.engine.checked_sampler import CheckedSampler
from localllm.engine.sampler import free_sampler, new_sampler, sample
from localllm.engine_api import LoadConfig, SamplingConfig

PROMPT = "Give me a JSON object describing a cat: "


def _generate(m: BatchModel, chain, n: int, checked: bool) -> list[int]:
    toks = m.tok.tokenize(PROMPT)
    m.seq_rm(0)
    m.decode([(t, i, 0, i == len(toks) - 1) for i, t in enumerate(toks)])
    out, i, pos = [], len(toks) - 1, len(toks)
    for _ in range(n):
        tok = m.sample(chain, i) if checked else sample(chain, m.ctx, i)
        if m.is_eog(tok):
            break
        out.append(tok)
        m.decode([(tok, pos, 0, True)])
        i, pos = 0, pos + 1
    return out


@pytest.mark.slow
def test_sample_then_check_equals_grammar_first_under_greedy(smollm2: Path) -> None:
    m = BatchModel()
    m.load(smollm2, LoadConfig(n_ctx=256, n_threads=2), 1)
    try:
        gbnf = grammar.json_object()
        free = m.new_sampler(SamplingConfig(temperature=0))
        plain = _generate(m, free, 12, checked=True)
        m.free_sampler(free)
        checked_chain = m.new_sampler(SamplingConfig(temperature=0, grammar=gbnf))
        assert isinstance(checked_chain, CheckedSampler)
        checked = _generate(m, checked_chain, 64, checked=True)
        m.free_sampler(checked_chain)
        first = new_sampler(SamplingConfig(temperature=0, grammar=gbnf), m.tok.n_vocab, m.tok.vocab)
        reference = _generate(m, first, 64, checked=False)
        free_sampler(first)
        text = lambda ts: b"".join(m.piece(t) for t in ts).decode()  # noqa: E731
        assert not text(plain).lstrip().startswith("{")  # the model's own pick is refused: the resample path runs
        assert checked == reference
        assert isinstance(json.loads(text(checked)), dict)
    finally:
        m.close()
