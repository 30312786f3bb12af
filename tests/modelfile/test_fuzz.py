"""A fixed, seeded sample of scripts/fuzz_gguf.py's damaged GGUFs: each through
inspect, plan, run and list, each ending in one line (or success), never a
signal, a hang or a traceback. The full run is ``python -m scripts.fuzz_gguf``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scripts.fuzz_gguf import cases, run_case

# One of each kind the fuzzer makes, then a seeded draw of the rest.
_KINDS = (
    "truncated at byte",
    "= 18446744073709551615",
    "block_count = 0",
    "block_count = 2147483648",
    "attention.head_count as a string",
    "tokenizer.ggml.tokens as an int array",
    "general.alignment as a float",
    "general.name with escape sequences",
    "tensor name no layer number",
    "tensor duplicated",
    "tensor offset past the end",
    "attention.head_count_kv as an array of 1",
    "expert_used_count 2 without experts",
    "chat template that loops",
)
_DRAWN = 2


def _sample(synth_model: Path) -> list:
    all_cases = cases(synth_model, "synthetic")
    picked = []
    for kind in _KINDS:
        hits = [c for c in all_cases if kind in c.name]
        assert hits, kind
        picked.append(random.Random(kind).choice(hits))
    rest = [c for c in all_cases if c not in picked]
    return picked + random.Random(16).sample(rest, _DRAWN)


def test_sample_covers_every_kind(synth_model: Path) -> None:
    names = [c.name for c in _sample(synth_model)]
    assert len(names) == len(_KINDS) + _DRAWN and len(set(names)) == len(names)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_KINDS) + _DRAWN))
def test_fuzz_case(synth_model: Path, tmp_path: Path, index: int) -> None:
    case = _sample(synth_model)[index]
    result = run_case(case, tmp_path)
    assert result is not None, case.name
    assert result.ok, f"{case.name}: " + " | ".join(result.problems)
