"""The thinking/answer split (issue 47 item 6): whole, and streamed in pieces of
every size, a marker cut anywhere; thinking only at the start; the markers each
template family writes, found in the vendored templates' own text."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.reasoning import MARKERS, Markers, Splitter, markers, split

THINK = Markers("<think>", "</think>")


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def streamed(text: str, marks: Markers | None, size: int, started_open: bool = False) -> tuple[str, str]:
    s = Splitter(marks, started_open=started_open)
    parts = [p for piece in pieces(text, size) for p in s.feed(piece)] + s.finish()
    return "".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "content")


CASES = [
    ("<think>Let me add 2 and 2.</think>\n\nIt is 4.", "Let me add 2 and 2.", "It is 4."),
    ("  <think>a</think>b", "a", "b"),
    ("No thinking here. <think>not this</think>", None, "No thinking here. <think>not this</think>"),
    ("<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("<thin", None, "<thin"),  # a reply that only looks like the start of a marker
    ("", None, ""),
]


@pytest.mark.parametrize(("text", "reasoning", "answer"), CASES)
def test_whole_and_streamed_in_every_piece_size_agree(text: str, reasoning: str | None, answer: str) -> None:
    assert split(text, THINK) == (reasoning, answer)
    for size in range(1, max(len(text), 1) + 1):
        assert streamed(text, THINK, size) == (reasoning or "", answer), size


def test_a_prompt_that_opens_the_thinking() -> None:
    text = "first, 2+2 is 4</think>The answer is 4."
    assert split(text, THINK, started_open=True) == ("first, 2+2 is 4", "The answer is 4.")
    for size in (1, 2, 3, 7):
        assert streamed(text, THINK, size, started_open=True) == ("first, 2+2 is 4", "The answer is 4.")


def test_no_markers_means_all_answer() -> None:
    assert split("<think>x</think>y", None) == (None, "<think>x</think>y")


def test_a_streamed_piece_never_holds_half_a_marker() -> None:
    s = Splitter(THINK)
    seen = [p for piece in pieces("<think>abc</think>def", 1) for p in s.feed(piece)] + s.finish()
    assert all("<" not in t and ">" not in t for _, t in seen), seen


@pytest.mark.parametrize("m", MARKERS)
def test_every_family_splits(m: Markers) -> None:
    assert split(f"{m.open}why{m.close} what", m) == ("why", "what")


def test_markers_come_from_the_template_and_its_generation_prompt() -> None:
    qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    assert markers(qwen3, "<|im_start|>assistant\n") == (THINK, False)
    assert markers("... {{ '<think>\\n' }}", "<｜Assistant｜><think>\n") == (THINK, True)
    assert markers("{{ '<|START_THINKING|>' }}")[0] == MARKERS[1]
    assert markers("{% for m in messages %}{{ m.content }}{% endfor %}") == (None, False)
    assert markers(None) == (None, False)


TEMPLATES = Path(__file__).parent / "templates"  # copies of llama.cpp's models/templates (vendored 0.3.36)
EXPECTED = {
    "ByteDance-Seed-OSS": MARKERS[3], "CohereForAI-c4ai-command-r7b-12-2024-tool_use": MARKERS[1], "GLM-4.6": THINK,
    "Kimi-K2-Thinking": THINK, "Qwen-Qwen3-0.6B": THINK, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": THINK,
    "mistralai-Ministral-3-14B-Reasoning-2512": MARKERS[2], "meta-llama-Llama-3.1-8B-Instruct": None,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_markers_of_llama_cpps_templates(name: str) -> None:
    from localllm.engine.chat_template import ChatTemplate

    source = (TEMPLATES / f"{name}.jinja").read_text()
    t = ChatTemplate(source, name)
    msgs = [{"role": "user", "content": "hi"}]
    with_prompt = t.render(msgs, bos_token="<s>", eos_token="</s>", add_generation_prompt=True)
    without = t.render(msgs, bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
    found, opened = markers(source, with_prompt[len(without):])
    assert found == EXPECTED[name]
    # R1's template opens <think> and, unless enable_thinking is set, closes it at once: the reply is all answer
    assert opened is False


# gpt-oss's harmony replies, as llama.cpp's tests/test-chat.cpp writes them
HARMONY_CASES = [
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
     "I'm\nthinking", "Hello, world!\nWhat's up?"),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary<|message|>Hi", "I'm\nthinking", "Hi"),
    ("Hello", None, "Hello"),
    # a call is the tool parser's: it goes on as harmony text, behind <|start|>assistant, ended by <|call|>
    ("<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>"
     '{"a": 1}', "Thinking", '<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>{"a": 1}<|call|>'),
    (' to=functions.f<|channel|>analysis<|message|>{"a": 1}', None, '<|start|>assistant to=functions.f<|channel|>analysis<|message|>{"a": 1}<|call|>'),
    # thinking cut by max_tokens is all reasoning
    ("<|channel|>analysis<|message|>still thinking", "still thinking", ""),
]


@pytest.mark.parametrize("text, reasoning, answer", HARMONY_CASES)
def test_harmony_channels_split_whole_and_streamed(text: str, reasoning: str | None, answer: str) -> None:
    from localllm.reasoning import HARMONY

    assert split(text, HARMONY) == (reasoning, answer)
    s = Splitter(HARMONY)
    parts = [p for ch in text for p in s.feed(ch)] + s.finish()
    assert ("".join(t for k, t in parts if k == "reasoning") or None, "".join(t for k, t in parts if k == "content")) == (reasoning, answer)


def test_gpt_oss_template_gives_the_harmony_split() -> None:
    from localllm.reasoning import HARMONY

    source = (Path(__file__).parent.parent / "toolcalls" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    assert markers(source, "<|start|>assistant") == (HARMONY, False)
    assert markers(source, "<|start|>assistant<|channel|>analysis<|message|>") == (HARMONY, True)
    assert split("more thought<|end|><|start|>assistant<|channel|>final<|message|>Hi", HARMONY, started_open=True) == ("more thought", "Hi")


def test_a_megabyte_harmony_call_streamed_in_small_pieces_is_quick() -> None:
    import time

    from localllm.reasoning import HARMONY

    text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" + '{"blob": "' + "a" * (1 << 20)
    t0 = time.perf_counter()
    s = Splitter(HARMONY)
    parts = [p for i in range(0, len(text), 256) for p in s.feed(text[i:i + 256])] + s.finish()
    assert parts == [("content", "<|start|>assistant" + text + "<|call|>")]
    assert time.perf_counter() - t0 < 5
