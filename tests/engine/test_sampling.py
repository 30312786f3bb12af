"""The sampler chain on the default model in real llama.cpp: a fixed seed
repeats its reply, top-k 1 is greedy, the repeat penalty changes what is drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig

PROMPT = "Write a short poem about the sea."


def _reply(b: LlamaCppBackend, s: SamplingConfig) -> list[int]:
    return [e.token_id for e in b.stream(PROMPT, s)]


@pytest.mark.slow
def test_seed_repeats_and_top_k_1_is_greedy(smollm2: Path) -> None:
    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=512, n_threads=2))
        seeded = SamplingConfig(seed=1234, max_tokens=24, ignore_eos=True)  # every other field at the shared defaults
        first, again = _reply(b, seeded), _reply(b, seeded)
        other_seed = _reply(b, SamplingConfig(seed=99, max_tokens=24, ignore_eos=True))
        greedy = _reply(b, SamplingConfig(temperature=0, max_tokens=24, ignore_eos=True))
        top1 = _reply(b, SamplingConfig(top_k=1, temperature=1.5, seed=5, max_tokens=24, ignore_eos=True))
        penalised = _reply(b, SamplingConfig(temperature=0, repeat_penalty=1.5, max_tokens=24, ignore_eos=True))
    assert first == again and len(first) == 24
    assert other_seed != first  # the seed is used: another seed draws another reply
    assert top1 == greedy
    assert penalised != greedy  # the penalty is in the chain (greedy alone would repeat the greedy reply)
