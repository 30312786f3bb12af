"""The thinking budget's state machine, as llama.cpp's reasoning-budget sampler
(common/reasoning-budget.cpp): armed by the start marker, counted down, the end
forced token by token, never inside a character, re-armed by a new block."""

from __future__ import annotations

import pytest

from localllm.reasoning.budget import COUNTING, DONE, FORCING, IDLE, WAITING_UTF8, Budget, utf8_complete

END = [901, 902, 903]  # "</think>" in three tokens


def _run(b: Budget, pieces: list[bytes]) -> list[int | None]:
    """The forced token before each piece is fed (None: sampled freely)."""
    out = []
    for p in pieces:
        out.append(b.forced())
        b.accept(p)
    return out


def test_a_reply_that_opens_its_thinking_is_cut_after_n_tokens() -> None:
    b = Budget(3, b"<think>", b"</think>", END)
    assert _run(b, [b"<think>", b"a", b"b", b"c"]) == [None] * 4
    assert b.state == FORCING and b.forced() == 901
    assert _run(b, [b"</", b"think", b">"]) == [901, 902, 903]
    assert b.state == DONE and b.forced() is None and b.thought == 6 and b.forced_count == 1
    assert _run(b, [b"The", b" answer"]) == [None, None]


def test_a_natural_end_spends_nothing_more() -> None:
    b = Budget(10, b"<think>", b"</think>", END)
    _run(b, [b"<th", b"ink>", b"ok", b"</th", b"ink>"])  # markers in other tokens than the tokenizer's own count too
    assert b.state == DONE and b.forced_count == 0


def test_the_prompt_can_open_the_thinking_or_close_it() -> None:
    opened = Budget(2, b"<think>", b"</think>", END)
    opened.prime([b"<|Assistant|>", b"<think>", b"\n"])  # DeepSeek R1's generation prompt: "\n" is the budget's first token
    assert opened.state == COUNTING and opened.remaining == 1
    closed = Budget(2, b"<think>", b"</think>", END)
    closed.prime([b"<think>", b"\n\n", b"</think>", b"\n\n"])  # Qwen3's with enable_thinking false
    assert closed.state == DONE
    none = Budget(5, b"<think>", b"</think>", END)
    none.prime([b"<|im_start|>", b"assistant", b"\n"])
    assert none.state == IDLE


def test_a_zero_budget_forces_the_whole_end_even_after_the_prompts_newline() -> None:
    b = Budget(0, b"<think>", b"</think>", END)
    b.prime([b"<think>", b"\n"])
    assert _run(b, [b"</", b"think", b">"]) == END and b.state == DONE


def test_a_character_is_never_cut() -> None:
    b = Budget(1, b"<think>", b"</think>", END)
    b.accept(b"<think>")
    b.accept("é".encode()[:1])  # the budget is spent inside a character
    assert b.state == WAITING_UTF8 and b.forced() is None
    b.accept("é".encode()[1:])
    assert b.forced() == 901


def test_a_new_block_gets_a_fresh_budget() -> None:
    b = Budget(1, b"<think>", b"</think>", END)
    _run(b, [b"<think>", b"x", b"</", b"think", b">", b"y", b"<think>"])
    assert b.state == COUNTING and b.remaining == 1


def test_unlimited_is_no_budget() -> None:
    with pytest.raises(ValueError):
        Budget(-1, b"<think>", b"</think>", END)


def test_utf8_completeness_as_llama_cpp_reads_it() -> None:
    assert utf8_complete(b"abc") and utf8_complete("é".encode()) and utf8_complete("€".encode()) and utf8_complete(b"")
    assert not utf8_complete("€".encode()[:2]) and not utf8_complete("😀".encode()[:3])
