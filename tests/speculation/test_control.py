"""When a sequence drafts: on while drafts are kept, off below a rate, on again
when the drafts it would have made would have been kept."""

from __future__ import annotations

import pytest

from localllm.speculation import Controller, line, rows
from localllm.speculation.control import K_MAX, K_START, OFF_BELOW, WINDOW


def test_auto_turns_off_when_drafts_are_rejected_and_on_when_they_would_be_kept() -> None:
    c = Controller("auto")
    assert c.wants() == K_START
    while c.on:
        c.verified(c.wants(), 0)
    assert c.off_switches == 1 and c.wants() == 0 and c.acceptance == 0.0
    for _ in range(WINDOW):  # off: its shadow drafts are scored against what the model gives, at no cost
        c.shadow([7, 7])
        c.observed(7)
        c.observed(7)
        if c.on:
            break
    assert c.on and c.wants() == K_START


def test_the_draft_grows_while_whole_drafts_are_kept_and_halves_when_none_is() -> None:
    c = Controller("lookup", k_max=12)
    c.verified(4, 4)
    assert c.k == 8
    c.verified(8, 8)
    assert c.k == 12  # doubled, up to the rows the context has
    c.verified(12, 6)
    assert c.k == 12  # some kept: the same length
    c.verified(12, 0)
    assert c.k == 6 and c.on  # lookup never turns itself off
    for _ in range(40):
        c.verified(c.k, 0)
    assert c.on and c.k == 1 and c.acceptance is not None and c.acceptance < OFF_BELOW


def test_auto_turns_off_early_when_nothing_at_all_is_kept() -> None:
    c = Controller("auto")
    c.verified(K_START, 0)
    assert c.on
    c.verified(c.k, 0)
    assert not c.on  # two drafts, none of their tokens kept: no need to wait for a whole window


def test_auto_turns_off_when_batches_are_slower_than_one_token_steps() -> None:
    c = Controller("auto")
    c.single(10_000_000)  # a one-token step: 10 ms
    for _ in range(6):
        c.verified(4, 2, 45_000_000)  # 3 tokens for 45 ms: slower than 3 one-token steps
        if not c.on:
            break
    assert not c.on and c.off_switches == 1
    for _ in range(WINDOW):  # a shadow that would be kept half the time does not pay at that batch cost: stays off
        c.shadow([1, 2, 3, 4])
        for t in (1, 2, 9):
            c.observed(t)
    assert not c.on


def test_none_never_drafts_and_the_counts_say_nothing_when_nothing_was_drafted() -> None:
    assert Controller("none").wants() == 0 and Controller("none").acceptance is None
    assert rows("none") is None and rows("auto") == rows("lookup") == K_MAX + 1
    assert line(0, 0) == "nothing drafted" and line(10, 7) == "7 of 10 drafted tokens kept (70%)"
    with pytest.raises(ValueError):
        Controller("sometimes")


def test_a_cold_auto_starts_off_and_a_draft_verified_while_off_is_not_a_second_switch() -> None:
    c = Controller("auto", cold=True)
    assert not c.on and c.wants() == 0 and Controller("lookup", cold=True).on
    for _ in range(4):
        c.verified(K_START, 0)  # drafts made while off (a long quote's, drafting.py): counted, no switch
    assert c.drafted == 4 * K_START and c.off_switches == 0 and not c.on
