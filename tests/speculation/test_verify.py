"""A draft's tokens are kept only where they are the model's sample, so the reply
is the one without speculation, token for token, for a seeded sampler: checked
against a model whose logits do not depend on the batch (a function of the
tokens before), with a seeded draw per position, over many replies."""

from __future__ import annotations

import random

import pytest

from localllm.speculation import Controller, NgramIndex, verify

VOCAB = 12


def _probs(context: tuple[int, ...]) -> list[float]:
    """The toy model: peaked on copying the token 5 back (so n-gram drafts are often right)."""
    rng = random.Random(hash(context[-3:]))
    w = [rng.random() for _ in range(VOCAB)]
    if len(context) >= 5:
        w[context[-5]] += 6.0
    total = sum(w)
    return [x / total for x in w]


def _sample(rng: random.Random, p: list[float]) -> int:
    u, acc = rng.random(), 0.0
    for t, x in enumerate(p):
        acc += x
        if u < acc:
            return t
    return len(p) - 1


def _plain(prompt: list[int], n: int, seed: int) -> list[int]:
    rng, ctx = random.Random(seed), list(prompt)
    for _ in range(n):
        ctx.append(_sample(rng, _probs(tuple(ctx))))
    return ctx[len(prompt):]


def _speculative(prompt: list[int], n: int, seed: int, mode: str) -> tuple[list[int], Controller]:
    rng, ctx = random.Random(seed), list(prompt)
    index, ctl = NgramIndex(prompt), Controller(mode)
    ctx.append(_sample(rng, _probs(tuple(ctx))))  # the first token, from the prompt's last row
    index.add(ctx[-1])
    while len(ctx) - len(prompt) < n:
        draft = index.draft(min(ctl.wants(), n - (len(ctx) - len(prompt)) - 1)) if ctl.wants() else []
        if not ctl.wants():
            ctl.shadow(index.draft(4))
        # row r's logits: the model after the context and the draft's first r tokens (a batch's rows)
        given = verify(draft, lambda r, d=draft: _sample(rng, _probs(tuple(ctx + d[:r]))))
        ctl.verified(len(draft), len(given) - 1)
        for t in given:
            ctx.append(t)
            index.add(t)
            ctl.observed(t)
    return ctx[len(prompt):n + len(prompt)], ctl


@pytest.mark.parametrize("mode", ["lookup", "auto"])
def test_a_seeded_reply_is_the_one_without_speculation(mode: str) -> None:
    drafted = accepted = 0
    for seed in range(60):
        prompt = [random.Random(seed).randrange(VOCAB) for _ in range(20)]
        spec, ctl = _speculative(prompt, 80, seed, mode)
        assert spec == _plain(prompt, 80, seed), seed
        drafted, accepted = drafted + ctl.drafted, accepted + ctl.accepted
    assert drafted > 500 and 0 < accepted < drafted  # drafts were made, and both kept and refused


def test_a_refused_first_token_gives_the_sample_and_a_whole_draft_one_more() -> None:
    rows = iter([4, 9])
    assert verify([4, 5, 6], lambda r: next(rows)) == [4, 9]
    assert verify([1, 2], lambda r: [1, 2, 3][r]) == [1, 2, 3]
    assert verify([], lambda r: 7) == [7]
