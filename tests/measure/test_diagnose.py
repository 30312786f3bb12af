"""The verdict under the latency panel: "slow" only when a rate is under reading
speed (~10 t/s) or decode is far under this machine's roofline; otherwise it says
what dominates the reply. And the starved-decode advice (``measure.starved``)."""

from __future__ import annotations

import pytest

from localllm.engine_api.stats import compute_stats
from localllm.measure.diagnose import verdict
from localllm.measure.starved import Busy, StarveWatch, advice, starved

MS = 1_000_000


def stats(ttft_ms: float, itl_ms: float, tokens: int, prompt_tokens: int = 100):
    """A reply as an engine stamps it: the first token at ``ttft_ms``, then one
    every ``itl_ms``; prefill took the TTFT, each decode one ITL."""
    stamps = [int((ttft_ms + i * itl_ms) * MS) for i in range(tokens)]
    return compute_stats(start_ns=0, token_ns=stamps, prompt_tokens=prompt_tokens, prefill_ns=int(ttft_ms * MS),
                         decode_ns=int(itl_ms * MS) * (tokens - 1), decode_evals=tokens - 1, load_ms=0,
                         end_ns=stamps[-1], stop_reason="length")


@pytest.mark.parametrize(("ttft_ms", "itl_ms", "tokens", "prompt", "ceiling", "slow", "headline", "detail"), [
    # The case: 101.9 t/s is not slow; streaming dominates, and the line says so.
    (300, 1000 / 101.9, 200, 100, None, False, "streaming is 87% of the reply", "101.9 t/s: faster than reading"),
    (300, 40, 10, 100, None, False, "streaming is 55% of the reply", "ITL p50 40.0 ms, 25.0 t/s"),
    # 488 tokens at 80 t/s: 6.1 s of waiting, dominated by the prompt, but read faster than anyone reads
    (6100, 12.5, 40, 488, None, False, "TTFT is 93% of the reply", "488 prompt tokens at 80 t/s"),
    # under reading speed: slow, whatever dominates
    (100, 250, 20, 100, None, True, "slow stream: 4.0 t/s", "under reading speed (~10 t/s)"),
    (800, 20, 6, 3, None, True, "slow start: prompt read at 3.8 t/s", "TTFT is 89% of the reply"),
    # just at reading speed is not under it
    (100, 100, 20, 100, None, False, "streaming is 95% of the reply", "10.0 t/s: faster than reading"),
    # fast enough to read, but a third of what the memory bandwidth allows: slow
    (300, 40, 10, 100, 90.0, True, "slow stream: decode at 28% of roofline", "25.0 of 90 t/s possible here"),
    (300, 40, 10, 100, 60.0, False, "streaming is 55% of the reply", ""),  # 42% of the roofline: not far under it
    # both under reading speed: the larger share of the reply is named
    (5000, 200, 5, 10, None, True, "slow start: prompt read at 2.0 t/s", "TTFT is 86% of the reply"),
    (500, 200, 20, 4, None, True, "slow stream: 5.0 t/s", "streaming is 88% of the reply"),
])
def test_verdict_table(ttft_ms, itl_ms, tokens, prompt, ceiling, slow, headline, detail) -> None:
    v = verdict(stats(ttft_ms, itl_ms, tokens, prompt), ceiling)
    assert v is not None
    assert v.slow is slow
    assert v.headline == headline
    assert detail in v.detail
    assert ("slow" in v.headline) is slow  # the word appears exactly when the figures say so


def test_no_token_no_verdict_and_one_token_judges_the_prompt_only() -> None:
    empty = compute_stats(start_ns=0, token_ns=[], prompt_tokens=5, prefill_ns=MS, decode_ns=0, decode_evals=0, load_ms=0,
                          end_ns=MS, stop_reason="length")
    assert verdict(empty) is None
    one = verdict(stats(300, 40, 1), ceiling_tps=1000.0)
    assert one is not None and one.bottleneck == "prefill" and not one.slow  # no decode rate: nothing to call slow


@pytest.mark.parametrize(("rate", "earlier", "expected"), [
    (0.2, 69.0, (69.0, "this model reached earlier here")),  # the laptop: 0.2 t/s after 69
    (22.9, 69.0, (69.0, "this model reached earlier here")),
    (23.0, 69.0, None),  # exactly a third is not under it
    (60.0, 69.0, None),  # one reply's usual variation
    (5.0, None, None),  # the model's first reply: nothing of its own to compare with
    (None, 69.0, None),  # not measured (one token): no advice
])
def test_starved_table(rate, earlier, expected) -> None:
    assert starved(rate, earlier) == expected


@pytest.mark.parametrize(("threads", "busy", "line"), [
    (4, Busy("stress", 4242, 190.0), "stress (pid 4242) is using 190% CPU; start with --threads 2 (F3: threads 2) or close it"),
    (2, Busy("stress", 4242, 100.0), "stress (pid 4242) is using 100% CPU; start with --threads 1 (F3: threads 1) or close it"),
    (2, Busy("stress", 4242, 350.0), "--threads 1 (F3: threads 1)"),  # never below one thread
    (1, Busy("stress", 4242, 95.0), "close it: one decode thread is already the fewest"),
    (8, None, "another program may be using the CPU; start with --threads 4"),
])
def test_advice_names_the_fix(threads, busy, line) -> None:
    text = advice(0.2, (69.0, "this model reached earlier here"), threads, busy)
    assert text.startswith("decode ran at 0.2 t/s, under a third of the 69.0 t/s this model reached earlier here: ")
    assert line in text and "\n" not in text


def test_watch_tells_once_per_model_against_its_own_best() -> None:
    watch = StarveWatch()
    assert [watch.check("a", r) for r in (60.0, 100.0, 40.0)] == [None, None, None]  # 40 is not under a third of 100
    assert watch.check("b", 20.0) is None  # another model: its own history
    assert watch.check("a", 30.0) == (100.0, "this model reached earlier here")
    assert watch.check("a", 10.0) is None  # told once
    assert watch.check("b", 5.0) == (20.0, "this model reached earlier here")
