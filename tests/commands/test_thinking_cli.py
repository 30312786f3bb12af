"""Thinking in the terminal: ``run --reasoning-budget`` forces the end of the
thinking after N tokens, and ``chat`` folds the thinking into one line with its
figures, takes ``/think on|off`` and reports the time to the first answer token.
SmolLM2 with DeepSeek R1's real template (its generation prompt opens the
thinking, so without a budget a short reply is all thinking)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import cli

pytestmark = pytest.mark.slow
R1 = Path(__file__).resolve().parents[1] / "reasoning" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
BASE = ("--template", str(R1), "-n", "24", "--temp", "0", "--threads", "1", "--ctx", "512")


def test_run_forces_the_end_of_thinking_after_the_budget(tmp_path: Path) -> None:
    env = {"LOCALLLM_HOME": str(tmp_path)}
    free = json.loads(cli("run", "smollm2", "-p", "What is two plus two?", *BASE, "--json", env=env).stdout)["text"]
    cut = json.loads(cli("run", "smollm2", "-p", "What is two plus two?", *BASE, "--reasoning-budget", "4", "--json", env=env).stdout)["text"]
    assert "</think>" not in free  # all thinking: the model never closes it in 24 tokens
    thought, _, answer = cut.partition("</think>")
    assert thought and answer.strip() and free.startswith(thought)  # the same thinking, cut, then an answer
    bad = cli("run", "smollm2", "-p", "hi", "--reasoning-budget", "-2", env=env)
    assert bad.returncode == 2 and "--reasoning-budget must be at least -1" in bad.stderr


def test_chat_folds_the_thinking_and_takes_think_off(tmp_path: Path) -> None:
    env = {"LOCALLLM_HOME": str(tmp_path)}
    r = cli("chat", "smollm2", *BASE, "--reasoning-budget", "4", "--no-save", "--json", stdin="What is two plus two?\n", env=env)
    assert r.returncode == 0, r.stderr
    turn = json.loads(r.stdout.splitlines()[0])
    # the budget's first token is the prompt's newline after <think> (as llama.cpp counts it): 3 more, then </think>
    assert turn["reasoning"] and turn["reasoning_tokens"] == 3 and turn["reasoning_ms"] is not None
    assert turn["answer_ttft_ms"] > turn["ttft_ms"] and "</think>" in turn["reply"]
    shown = cli("chat", "smollm2", *BASE, "--reasoning-budget", "4", "--no-save", stdin="What is two plus two?\n/think off\nAnd three plus three?\n",
                env=env)
    assert shown.returncode == 0, shown.stderr
    assert "[thought for 3 tokens," in shown.stderr and "answer after" in shown.stderr and "thinking off from the next message" in shown.stderr
    first = shown.stdout.split("</think>")[0]
    assert "</think>" not in shown.stdout.splitlines()[0] and not first.startswith(turn["reasoning"])  # folded: the answer alone
