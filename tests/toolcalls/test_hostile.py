"""The model's text is untrusted: whatever it writes after a format's marker
(nothing, a cut-off call, invalid JSON, a megabyte of arguments, deep
nesting, another family's control tokens) parses without an exception, as
content, the same streamed as whole; and a call is never read out of
another family's markup."""

from __future__ import annotations

import time

import pytest

from localllm.toolcalls import FORMATS, GENERIC, HARMONY, HERMES, QWEN3_CODER, Format, Stream, collect, parse

CONTROL = "<|im_end|><|eot_id|><|start|>assistant<|channel|>final<|message|></tool_call>[/TOOL_CALLS]<｜tool▁calls▁end｜>"


def _openers(fmt: Format) -> list[str]:
    return list(fmt.markers) or ["{"]


def _hostile(fmt: Format) -> list[str]:
    out = []
    for m in _openers(fmt):
        out += [m, m + "{", m + '{"name": "f", "arguments": {"a": ', m + "not json at all", m + CONTROL,
                m + '{"name": "f", "arguments": {}, "extra": 1}', m + "\x00\x1b[2J" + m, "text " + m + " more " + m,
                m + "[" * 5000, m + "{" * 5000, m + "<function=" + "x" * 300, m + '<invoke name="' + "y" * 300]
    return out


CASES = [(fmt, text) for fmt in FORMATS for text in _hostile(fmt)]


@pytest.mark.parametrize("fmt, text", CASES, ids=[f"{f.name}-{i}" for i, (f, _) in enumerate(CASES)])
def test_hostile_text_is_content_whole_and_streamed(fmt: Format, text: str) -> None:
    whole = parse(text, fmt)
    assert whole.calls == [] or all(c.name in ("f",) for c in whole.calls)  # only the one well-formed call of the list may be read
    if not whole.calls and fmt is not HARMONY:  # nothing lost: the text is content (less Command R's answer markers)
        shown = text
        for dropped in ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"):
            shown = shown.replace(dropped, "") if fmt.name.startswith("command-r") else shown
        assert (whole.reasoning or "") + whole.content == shown
    s = Stream(fmt)
    step = 1 if len(text) < 400 else 97
    parts = [p for i in range(0, len(text), step) for p in s.feed(text[i:i + step])] + s.finish()
    assert collect(parts, s) == whole


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_a_megabyte_of_arguments_cut_short_is_content_and_quick(fmt: Format) -> None:
    text = "Sure. " + _openers(fmt)[0] + '{"name": "f", "arguments": {"blob": "' + "a" * (1 << 20)
    t0 = time.perf_counter()
    whole = parse(text, fmt)
    s = Stream(fmt)
    parts = [p for i in range(0, len(text), 1 << 16) for p in s.feed(text[i:i + (1 << 16)])] + s.finish()
    took = time.perf_counter() - t0
    assert whole.calls == [] and whole.content == text and collect(parts, s) == whole
    assert took < 5, f"{took:.1f} s"


def test_no_family_reads_another_familys_calls() -> None:
    """<tool_call> is Hermes's JSON, Qwen3-Coder's XML and GLM's key/values: each reads only its own."""
    hermes_call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    coder_call = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    assert [c.name for c in parse(hermes_call, HERMES).calls] == ["f"]
    assert parse(hermes_call, QWEN3_CODER).calls == []
    assert [c.arguments for c in parse(coder_call, QWEN3_CODER).calls] == [{"a": 1}]
    assert parse(coder_call, HERMES).calls == []
    assert parse(hermes_call, GENERIC).calls == []  # generic: the call is the whole reply


def test_harmony_without_its_markers_is_plain_content() -> None:
    """A gpt-oss reply whose control tokens were not rendered as text: all content."""
    assert parse("Hello, world!\nWhat's up?", HARMONY).content == "Hello, world!\nWhat's up?"
    got = parse("<|channel|>final<|message|>Hi<|end|>", HARMONY)
    assert (got.reasoning, got.content, got.calls) == (None, "Hi", [])
