"""The engine's side of adaptive threads (``engine.threadctl``): each decode asks
the controller for a count and sets it on the context with ``llama_set_n_threads``
when it changes, one-token steps on ``n_threads``, batches on ``n_threads_batch``;
and tells it the step's time."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine.batch import BatchModel
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.threads import ThreadController


class Scripted(ThreadController):
    """Counts chosen by the test; the steps it is told of, kept."""

    def __init__(self, token: int, batch: int) -> None:
        super().__init__(1, hi=64)
        self.want = {"token": token, "prefill": batch, "multi": batch}
        self.seen: list[tuple[str, int, int]] = []

    def choose(self, kind: str, size: int = 1) -> int:
        return self.want[kind]

    def observe(self, kind: str, size: int, n: int, ns: int) -> None:
        assert ns > 0
        self.seen.append((kind, size, n))


@pytest.mark.slow
def test_each_step_sets_its_kinds_count(smollm2: Path) -> None:
    with LlamaCppBackend() as backend:
        backend.load(smollm2, LoadConfig(n_ctx=512))
        ctl = backend.threads
        assert ctl is not None and not ctl.fixed and backend.info is not None and backend.info.n_threads == ctl.start
        with backend.stream("Count to five.", SamplingConfig(temperature=0.0, max_tokens=6)) as gen:
            for _ in gen:
                pass
        assert gen.stats is not None and gen.stats.threads is not None
        assert gen.stats.threads["mode"] == "adaptive" and {"token", "prefill"} <= set(gen.stats.threads["now"])
        # a scripted controller: the counts reach the context
        steer = backend._handle.steer  # the engine's own test: its private parts are in reach
        assert steer is not None
        scripted = Scripted(token=1, batch=3)
        steer.controller = scripted
        with backend.stream("Count to five.", SamplingConfig(temperature=0.0, max_tokens=4)) as gen:
            for _ in gen:
                pass
        ctx = backend._handle.ctx
        assert (llama_cpp.llama_n_threads(ctx), llama_cpp.llama_n_threads_batch(ctx)) == (1, 3)
        kinds = [k for k, _, _ in scripted.seen]
        assert kinds[0] == "prefill" and set(kinds[1:]) == {"token"}
        assert all(n == (1 if k == "token" else 3) for k, _, n in scripted.seen)


@pytest.mark.slow
def test_threads_fixes_the_count(smollm2: Path) -> None:
    with LlamaCppBackend() as backend:
        backend.load(smollm2, LoadConfig(n_ctx=512, n_threads=1))
        ctl = backend.threads
        assert ctl is not None and ctl.fixed and ctl.choose("token") == 1 and ctl.choose("prefill", 64) == 1


@pytest.mark.slow
def test_serve_steps_of_several_sequences_are_their_own_kind(smollm2: Path) -> None:
    model = BatchModel()
    try:
        model.load(smollm2, LoadConfig(n_ctx=512), n_seq=2)
        assert model.steer is not None
        scripted = Scripted(token=1, batch=2)
        model.steer.controller = scripted
        model.decode([(1, 0, 0, False), (2, 1, 0, True), (1, 0, 1, True)])  # a prompt chunk: prefill
        model.decode([(3, 2, 0, True), (3, 1, 1, True)])  # one token of each of two sequences
        model.decode([(4, 3, 0, True)])  # one sequence, one token
        assert [k for k, _, _ in scripted.seen] == ["prefill", "multi", "token"]
        assert (llama_cpp.llama_n_threads(model.ctx), llama_cpp.llama_n_threads_batch(model.ctx)) == (1, 2)
    finally:
        model.close()
