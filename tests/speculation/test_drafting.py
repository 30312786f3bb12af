"""One sequence's drafting: a cold start for auto, a quote that has run long drafted
long at once, and a draft near the longest made the longest (its rows cost less each)."""

from __future__ import annotations

from localllm.speculation import Drafting
from localllm.speculation.control import K_START
from localllm.speculation.drafting import RUN_MIN
from localllm.speculation.history import FIRST, Replies

QUOTE = list(range(100, 200))


def test_auto_starts_cold_and_drafts_once_its_shadow_drafts_would_have_been_kept() -> None:
    # phrases of 8 tokens, each quoted again later but never 12 tokens on end (RUN_MIN)
    phrases = [[i + 1000 * j for j in range(8)] for i in range(1, 9)]
    d = Drafting([t for i, p in enumerate(phrases) for t in [50_000 + i, *p]], "auto", 64)
    assert d.draft() == [] and not d.ctl.on  # nothing matched, nothing measured: no batch
    for i, p in enumerate(phrases):
        for t in [60_000 + i, *p]:  # the reply quotes each phrase again: the shadow drafts would be kept
            d.seen(t)
            if not d.ctl.on:
                assert d.draft() == []
        if d.ctl.on:
            break
    assert d.ctl.on and i < 5
    d.seen(60_000 + i + 1)
    d.seen(phrases[i + 1][0])
    d.seen(phrases[i + 1][1])
    assert d.draft() == phrases[i + 1][2:2 + K_START]  # on: the controller's length
    assert Drafting([1, 2, 3, 1, 2], "lookup", 64).draft() == [3, 1, 2, 3]  # lookup drafts from the start


def test_a_quote_that_has_run_long_is_drafted_long_even_while_off() -> None:
    d = Drafting([7] + QUOTE + [8] + QUOTE[:RUN_MIN - 1], "auto", 64)
    assert not d.ctl.on and d.draft() == []  # a run of RUN_MIN - 1: the controller's say (off)
    d.seen(QUOTE[RUN_MIN - 1])
    assert d.draft() == QUOTE[RUN_MIN:2 * RUN_MIN]  # as far as it has run
    d = Drafting([7] + QUOTE + [8] + QUOTE[:40], "auto", 64)
    assert d.draft() == QUOTE[40:100] + [8, 100, 101, 102]  # past half the longest: the longest, 64
    assert d.draft(10) == QUOTE[40:50]  # within the reply's room


def test_a_whole_draft_longer_than_asked_for_doubles_from_its_own_length() -> None:
    d = Drafting([7] + QUOTE + [8] + QUOTE[:20], "lookup", 64)
    draft = d.draft()
    assert len(draft) == 20 and d.ctl.k == K_START  # the run's 20, not the controller's 4
    d.ctl.verified(len(draft), len(draft))
    assert d.ctl.k == 40


def test_a_request_that_ends_as_an_earlier_one_drafts_that_reply_until_its_own_parts_from_it() -> None:
    replies = Replies()
    prompt = list(range(1000, 1040))
    first = Drafting(prompt, "auto", 64, replies)
    reply = [7, 3, 9, 4, 4, 8, 1, 6, 2, 5, 0, 11, 12, 13, 14, 15, 16]
    for t in reply:
        first.seen(t)
    first.finish()
    again = Drafting([5, *prompt], "auto", 64, replies)  # the same last TAIL tokens
    assert again.draft() == reply[:FIRST]  # from its first token, while the controller is still cold
    again.seen(7)
    assert again.draft(3) == reply[1:4]
    again.seen(99)  # its reply parts from the earlier one: no more of it
    assert again.draft() == []
    other = Drafting(prompt[:-1] + [1], "auto", 64, replies)
    assert other.draft() == []  # a prompt that ends otherwise
    again.finish()
    assert replies.after(prompt) == [[7, 99], reply]  # the parted reply is remembered too, newest first
