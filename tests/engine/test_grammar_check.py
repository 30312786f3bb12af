"""The first-token check of a grammar (engine.grammar.check) refuses one that
takes over MAX_STEP_SECONDS to filter the vocabulary, but only after measuring
again: a first pass once took 357 ms of the thread's CPU in the test suite, for
a schema that takes 5-16 ms, while the kernel faulted in memory touched for the
first time."""

from __future__ import annotations

import pytest

from localllm.engine import grammar
from localllm.errors import InputError


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    import llama_cpp

    return smollm2_vocab, llama_cpp.llama_vocab_n_tokens(smollm2_vocab)


_REAL = grammar.filter_seconds


def _timed(monkeypatch: pytest.MonkeyPatch, readings: list[float]) -> list[float]:
    """``filter_seconds`` gives ``readings`` in turn (it still filters: the grammar is real)."""
    given: list[float] = []

    def reading(sampler, n_vocab):
        _REAL(sampler, n_vocab)
        given.append(readings[len(given)])
        return given[-1]

    monkeypatch.setattr(grammar, "filter_seconds", reading)
    return given


@pytest.mark.slow
def test_a_slow_first_pass_is_measured_again_before_a_refusal(vocab, monkeypatch: pytest.MonkeyPatch) -> None:
    v, n = vocab
    text = grammar.json_object()
    given = _timed(monkeypatch, [0.4, 0.01])
    grammar.check(v, text, n)  # the second pass is within the bound
    assert given == [0.4, 0.01]
    given = _timed(monkeypatch, [0.4, 0.3])
    with pytest.raises(InputError, match="took 300 ms to filter the vocabulary for one token; at most 250 ms"):
        grammar.check(v, text, n)
    given = _timed(monkeypatch, [0.01])
    grammar.check(v, text, n)
    assert given == [0.01]  # one pass where the first is within the bound



def _hog(stop) -> None:
    while not stop.is_set():
        pass


@pytest.mark.slow
def test_a_busy_machine_does_not_refuse_a_one_tool_grammar(gemma) -> None:
    """Issue 59 item 5: the bound is the grammar's own work (the checking thread's
    CPU time), not wall time. Gemma 3's 262,144 tokens make a one-tool grammar's
    first filter about 40 ms of CPU; with eight spinning processes a core, this
    thread gets about a ninth of one, so a wall-time bound of 250 ms refused it;
    the CPU-time bound lets it through every time. (The hostile schemas are still
    400s on a server: tests/serve/test_robust.py.)"""
    import multiprocessing
    import os
    import time

    import llama_cpp

    from localllm.serve import tools
    from tests.helpers.vocab import vocab_only

    one = tools.parse_request({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]},
        tools.HERMES)
    assert one is not None and one.grammar is not None
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    hogs = [ctx.Process(target=_hog, args=(stop,), daemon=True) for _ in range(8 * (os.cpu_count() or 1))]
    with vocab_only(gemma) as v:
        n = llama_cpp.llama_vocab_n_tokens(v)
        for h in hogs:
            h.start()
        try:
            time.sleep(0.3)  # every core busy before the checks
            t0, c0 = time.monotonic(), time.thread_time()
            for _ in range(2):  # the wall-time bound refused the first check already; each takes seconds under this load
                grammar.check(v, one.grammar, n)  # raises InputError if refused
            wall, cpu = time.monotonic() - t0, time.thread_time() - c0
        finally:
            stop.set()
            for h in hogs:
                h.join(5)
    print(f"2 checks: {wall:.2f} s wall, {cpu:.2f} s of this thread's CPU")
