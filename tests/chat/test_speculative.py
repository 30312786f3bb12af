"""Speculative decoding: prompt-lookup drafts, a draft model, and the engine's guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.chat.speculative import PromptLookup, generate
from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig
from localllm.errors import EngineError
from tests.helpers.cli import cli


def test_prompt_lookup_finds_the_latest_match() -> None:
    d = PromptLookup(max_ngram=3)
    ctx = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert d.propose(ctx, 2) == [7, 8]  # the latest earlier "1 2 3" was followed by 7 8
    assert d.propose([5, 6, 7], 4) == []
    assert d.propose([4, 5, 4], 3) == [5, 4]  # falls back to a shorter n-gram


def test_verify_refuses_instead_of_aborting(synth_model: Path) -> None:
    with LlamaCppBackend() as b:
        b.load(synth_model, LoadConfig(n_ctx=256))  # n_outputs_max=1
        with pytest.raises(EngineError, match="n_outputs_max >= 3"):
            b.verify([5, 6, 7])


def test_generate_keeps_the_cache_consistent(synth_model: Path) -> None:
    with LlamaCppBackend() as b:
        b.load(synth_model, LoadConfig(n_ctx=256, n_outputs_max=9))
        prompt = [1] + [10, 11, 12, 13] * 6
        run = generate(b, prompt, PromptLookup(), max_tokens=40, k=8, stop_at_eog=False)
        out = [e.token_id for e in run]
        # Each checking batch emits the tokens it accepted plus the model's own
        # next token; the first token comes from the prompt. So the count of
        # batches and the output length fix how many drafts were accepted (the
        # last batch's own token may be cut off by max_tokens).
        evals, spec = run.stats.decode_evals, run.spec
        assert len(out) == 40 and evals >= 1
        assert spec.accepted in (len(out) - 1 - evals, len(out) - evals), (spec, evals)
        assert spec.drafted > 0 and spec.accepted <= spec.drafted  # the repeated prompt always gives a draft
        # Every emitted token but the last is in the cache, right after the prompt.
        assert b.cache_tokens == prompt + out[:-1]
        assert run.stats.generated_tokens == 40


@pytest.mark.slow
def test_usage_errors() -> None:
    for args, needle in ((["--speculate", "draft", "--draft", "smollm2", "--temp", "0.7"], "add --temp 0"),
                         (["--speculate", "draft", "--temp", "0"], "needs --draft"), (["--speculate", "sometimes"], "invalid choice")):
        proc = cli("run", "-p", "hi", *args)
        assert proc.returncode == 2 and needle in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lookup", "draft"])
def test_speculative_run_matches_greedy(smollm2: Path, mode: str) -> None:
    prompt = "What is the capital of France? Answer in one word."
    plain = json.loads(cli("run", "--temp", "0", "-n", "24", "-p", prompt, "--json", "--speculate", "none").stdout)
    assert plain["speculative"] == {"mode": "none", "drafted": None, "accepted": None, "acceptance": None}
    extra = ["--draft", "smollm2"] if mode == "draft" else []
    proc = cli("run", "--temp", "0", "-n", "24", "-p", prompt, "--speculate", mode, *extra, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["text"] == plain["text"] and "Paris" in d["text"]
    assert d["speculative"]["mode"] == mode and d["speculative"]["drafted"] > 0


@pytest.mark.slow
def test_a_model_drafting_for_itself_is_mostly_accepted(smollm2: Path) -> None:
    from localllm.chat.speculative import DraftModel

    with LlamaCppBackend() as main, LlamaCppBackend() as draft:
        main.load(smollm2, LoadConfig(n_ctx=1024, n_outputs_max=9))
        draft.load(smollm2, LoadConfig(n_ctx=1024, n_outputs_max=9))
        tokens = main.prompt_tokens("Write a short story about a lighthouse keeper.", chat=True)
        run = generate(main, tokens, DraftModel(draft), max_tokens=64, k=8, stop_at_eog=False)
        out = list(run)
        assert len(out) == 64 and run.spec.drafted >= 20
        # Batched and one-token evaluation may flip a near-tie now and then; otherwise they agree.
        assert run.spec.acceptance >= 0.8


def test_draft_model_rate_counts_the_drafting(synth_model: Path) -> None:
    """The decode rate of speculative decoding is the rate the user sees: tokens
    over the wall time between the first and last token, the draft model's own
    decodes included. Timed here, by the test, as each token arrives."""
    import time

    from localllm.chat.speculative import DraftModel

    with LlamaCppBackend() as main, LlamaCppBackend() as draft:
        main.load(synth_model, LoadConfig(n_ctx=512, n_outputs_max=9))
        draft.load(synth_model, LoadConfig(n_ctx=512, n_outputs_max=9))
        seen = []
        run = generate(main, [1, 10, 11, 12], DraftModel(draft), max_tokens=48, k=4, stop_at_eog=False)
        for _ in run:
            seen.append(time.perf_counter())
        wall_rate = (len(seen) - 1) / (seen[-1] - seen[0])
        s = run.stats
        checking_only = s.decode_evals / (s.decode_ms / 1000)  # batches of the main model alone
        assert s.decode_tokens_per_s == pytest.approx(wall_rate, rel=0.15), (s.decode_tokens_per_s, wall_rate)
        # the drafting is not free: the rate the user sees is below "batches per second x tokens per batch"
        assert s.decode_tokens_per_s < checking_only * (len(seen) - 1) / s.decode_evals
