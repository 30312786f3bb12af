"""The n-gram drafter: the longest earlier occurrence of the tail, and what followed it."""

from __future__ import annotations

from localllm.speculation import NgramIndex


def test_it_drafts_what_followed_the_tails_last_occurrence() -> None:
    idx = NgramIndex([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert idx.draft(2) == [4, 5] and idx.draft(6) == [4, 5, 9, 1, 2, 3]
    # past the text's end the same rule goes on: "1 2 3" ends 6 back, so what follows repeats every 6
    assert idx.draft(10) == [4, 5, 9, 1, 2, 3, 4, 5, 9, 1]
    idx.add(7)  # "3 7" never came before: a 2-gram is the shortest it looks for
    assert idx.draft(3) == []


def test_the_longest_match_wins_and_the_latest_of_it() -> None:
    idx = NgramIndex([5, 6, 1, 8, 2, 5, 6, 1, 9, 6, 1])  # "6 1" last before at 7 (then 9); "5 6 1" not at the tail
    assert idx.draft(1) == [9]
    idx.add(9)  # "6 1 9" seen before, ending at 8: what followed it is 6
    assert idx.draft(2) == [6, 1]


def test_nothing_to_draft_from_a_fresh_text_and_truncate_forgets() -> None:
    assert NgramIndex([1, 2, 3]).draft(4) == [] and NgramIndex().draft(4) == []
    idx = NgramIndex([1, 2, 3, 1, 2])
    assert idx.draft(1) == [3]
    idx.truncate(3)
    assert idx.tokens == [1, 2, 3] and idx.draft(1) == []
    assert idx.draft(0) == []


def test_a_loop_is_drafted_around_as_far_as_asked() -> None:
    """A reply caught in a loop (a repeated line) drafts the whole length asked, not
    only up to the text's end: llama.cpp's lookup drafts token by token on its own
    draft, which comes to the same."""
    idx = NgramIndex([7, 8] + [1, 2, 3] * 3)
    assert idx.draft(8) == [1, 2, 3, 1, 2, 3, 1, 2]
    idx.add(1)
    assert idx.draft(4) == [2, 3, 1, 2]


def test_a_long_ngram_tells_apart_places_a_short_one_recurs() -> None:
    """Text that repeats a phrase with different endings: the last occurrence of the
    short tail is the wrong one; the 8-gram match finds where the whole line went on."""
    line_a = [10, 11, 12, 13, 14, 15, 20, 21]  # "... a batch of rows costs more"
    line_b = [10, 11, 12, 13, 14, 16, 22, 23]  # "... a batch of rows costs less"
    idx = NgramIndex([1, 2] + line_a + line_b + line_a[:5])
    assert idx.draft(3) == [16, 22, 23]  # the 4..5-token tail alone: the latest, line_b
    idx = NgramIndex(line_a + [30] + line_b + [31] + line_a + [30] + line_b + [31] + line_a[:5])
    assert idx.draft(3) == [15, 20, 21]  # its 8-gram (line_b's end, 31, line_a's start) came before only where line_a went on


def test_the_run_is_how_long_the_followed_quote_has_gone_on() -> None:
    quote = list(range(100, 140))
    idx = NgramIndex([1, 2] + quote + [3] + quote[:20])
    assert idx.run(64) == 20 and idx.run(8) == 8  # capped where asked
    assert idx.draft(5) == quote[20:25]
    idx.add(999)  # the quote broken off: nothing matches the tail
    assert idx.run(64) == 0


def test_a_long_text_is_indexed_at_once_with_the_same_answers() -> None:
    """From ``BULK`` tokens on, a prompt is indexed in arrays, not a token at a time:
    the answers are the ones the rules above give, the n-grams across the join with
    what was there before included."""
    from localllm.speculation.ngram import BULK

    text = list(range(1000, 1000 + BULK + 100))
    idx = NgramIndex(text + [5] + text[:30])
    assert idx.draft(4) == text[30:34] and idx.run(64) == 30
    pad = list(range(5000, 5000 + BULK))
    z1, z2, y = list(range(10, 18)), list(range(20, 28)), list(range(30, 38))
    idx = NgramIndex(pad + z1 + y + [100] + z2 + y + [200] + z1 + y)
    assert idx.draft(1) == [100]  # the tail's 8 tokens went on to 200 last; its 16 (z1, y) only to 100
    idx = NgramIndex(list(range(50)))
    idx.extend([500, *text, 48, 49, 500])  # "48 49 500" first ended across the join, at 50
    assert idx.draft(2) == [1000, 1001]
    idx.truncate(51)
    assert idx.tokens == [*range(50), 500] and idx.draft(1) == []
    idx.extend([48, 49])  # the index rebuilt from the first 51: "48 49" ended at 49, then came 500
    assert idx.draft(1) == [500]
