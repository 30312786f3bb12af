"""A sampler under a thinking budget (``localllm.reasoning.budget``): it samples as
the sampler it wraps until the budget forces a token, and then takes that token
without sampling, telling the wrapped chain it was taken (its penalties and
grammar see the reply as it is). llama.cpp does the same with a sampler in the
chain that sets every other logit to -inf (common/reasoning-budget.cpp); taking
the token outright skips a pass over the vocabulary and gives the same token.
"""

from __future__ import annotations

from collections.abc import Callable

import llama_cpp

from localllm.engine.checked_sampler import CheckedSampler
from localllm.engine.sampler import Greedy
from localllm.reasoning.budget import Budget


class Budgeted:
    """``inner`` (a chain, ``Greedy`` or ``CheckedSampler``) with ``budget``;
    ``draw(inner, ctx, i)`` samples from it; ``piece(token)`` is the token's bytes."""

    def __init__(self, inner: object, budget: Budget, draw: Callable[[object, object, int], int], piece: Callable[[int], bytes]) -> None:
        self.inner, self.budget, self._draw, self._piece = inner, budget, draw, piece

    @property
    def failed(self) -> str:
        """Why the wrapped sampler ended the request (serve's scheduler reads it)."""
        return getattr(self.inner, "failed", "")

    def sample(self, ctx: object, i: int) -> int:
        token = self.budget.forced()
        if token is None:
            token = self._draw(self.inner, ctx, i)
        else:
            accept(self.inner, token)
        self.budget.accept(self._piece(token))
        return token


def accept(sampler: object, token: int) -> None:
    """Tell ``sampler`` that ``token`` was taken without it."""
    if isinstance(sampler, Greedy):
        return
    if isinstance(sampler, CheckedSampler):
        sampler.accept(token)
        return
    llama_cpp.llama_sampler_accept(sampler, token)
