"""When to compact and which messages: the threshold, the flag's value, the summary's bound, the split."""

from __future__ import annotations

import pytest

from localllm.compaction import compactable, parse_fraction, should_compact, split, summary_tokens
from localllm.compaction.split import SUMMARY_LABEL


def test_the_threshold_is_a_fraction_of_the_context() -> None:
    assert should_compact(1741, 2048, 0.85) and not should_compact(1740, 2048, 0.85)
    assert not should_compact(2048, 2048, None)  # off
    assert not should_compact(10, 0, 0.5)  # no context known: never


@pytest.mark.parametrize("text, want", [("0.85", 0.85), ("85%", 0.85), ("1", 1.0), ("off", None), (" OFF ", None)])
def test_a_fraction_is_read_as_typed(text: str, want: float | None) -> None:
    assert parse_fraction(text) == want


@pytest.mark.parametrize("text, said", [("0", "above 0 and at most 1"), ("1.5", "above 0 and at most 1"), ("nan", "above 0"),
                                        ("lots", "'lots' is not a fraction of the context: give e.g. 0.85, 85% or off")])
def test_a_bad_fraction_is_one_line_naming_the_fix(text: str, said: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_fraction(text)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_the_summary_gets_an_eighth_of_the_context_within_bounds() -> None:
    assert summary_tokens(2048) == 256 and summary_tokens(128) == 32 and summary_tokens(131072) == 512


def _turns(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        out += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return out


def test_the_system_prompt_and_the_last_turns_are_kept_whole() -> None:
    messages = [{"role": "system", "content": "be brief"}, *_turns(4)]
    s = split(messages, 2)
    assert s.head == messages[:1] and s.older == messages[1:5] and s.kept == messages[5:]
    assert split(messages, 0).kept == [] and split(messages, 9).older == []
    assert compactable(messages, 2) and not compactable(messages, 4)


def test_a_turn_keeps_its_tool_calls_and_results() -> None:
    messages = [*_turns(1), {"role": "user", "content": "weather?"}, {"role": "assistant", "content": "<call>"},
                {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "sunny"}]
    s = split(messages, 1)
    assert s.head == [] and s.older == messages[:2] and s.kept == messages[2:]


def test_an_earlier_summary_is_no_turn_and_is_not_summarized_alone() -> None:
    summary = {"role": "user", "content": SUMMARY_LABEL + "they met"}
    messages = [{"role": "system", "content": "sys"}, summary, *_turns(2)]
    s = split(messages, 2)
    assert s.older == [summary] and not compactable(messages, 2)
    assert split([summary, *_turns(3)], 2).head == []  # a leading summary is no system prompt either
