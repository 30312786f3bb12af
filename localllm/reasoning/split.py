"""The thinking/answer split, streamed (see the package's docstring).

The delimiters are those llama.cpp's ``common/chat.cpp`` parses for the
templates that think in text (its ``thinking_start_tag``/``end_tag`` per
format): ``<think>``/``</think>`` (DeepSeek R1 and V3.1, Qwen3, GLM 4.5+,
Granite, Hunyuan, SmolLM3, MiniMax), Command R7B's
``<|START_THINKING|>``/``<|END_THINKING|>``, Magistral's ``[THINK]``/``[/THINK]``,
Seed-OSS's ``<seed:think>``/``</seed:think>`` and Kimi's ``◁think▷``/``◁/think▷``.
gpt-oss's harmony channels (``HARMONY``) are messages rather than markers:
``harmony.Channels`` splits them, behind the same ``Splitter``.

As llama.cpp does (``--reasoning-format deepseek``): thinking is only read at
the start of a reply (leading white space aside); a marker later in the answer
is the answer's text. A reply that ends inside its thinking (max_tokens) has
all of it as reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.reasoning.harmony import Channels, merged

REASONING, CONTENT = "reasoning", "content"


@dataclass(frozen=True)
class Markers:
    open: str
    close: str
    channels: bool = False  # gpt-oss's harmony messages: split by harmony.Channels, not by the two markers


HARMONY = Markers("<|channel|>analysis<|message|>", "<|end|>", channels=True)  # llama.cpp's thinking tags for gpt-oss


MARKERS = (
    Markers("<think>", "</think>"),
    Markers("<|START_THINKING|>", "<|END_THINKING|>"),
    Markers("[THINK]", "[/THINK]"),
    Markers("<seed:think>", "</seed:think>"),
    Markers("◁think▷", "◁/think▷"),
)


def markers(template: str | None, generation_prompt: str = "") -> tuple[Markers | None, bool]:
    """The markers ``template`` (the chat template's source) writes, and whether the
    generation prompt (what the template appends for the assistant's turn) leaves
    the thinking open; (None, False) for a template that does not think in text."""
    source = template or ""
    if "<|channel|>" in source and "<|message|>" in source:  # gpt-oss (toolcalls.detect reads the same markers)
        return HARMONY, generation_prompt.rstrip().endswith(HARMONY.open)
    for m in MARKERS:
        if m.open in source or m.close in source:
            return m, generation_prompt.rstrip().endswith(m.open)
    return None, False


class Splitter:
    """One reply's parts. ``feed(piece)`` returns the parts that are sure now;
    ``finish()`` the rest. ``started_open``: the prompt opened the thinking."""

    def __init__(self, marks: Markers | None, *, started_open: bool = False) -> None:
        self.marks = marks
        self.state = "think" if (marks is not None and started_open) else ("start" if marks is not None else "answer")
        self._held = ""
        self._channels = Channels(started_open=started_open) if marks is not None and marks.channels else None

    def feed(self, piece: str) -> list[tuple[str, str]]:
        if self._channels is not None:
            return self._channels.feed(piece)
        self._held += piece
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        if self._channels is not None:
            return self._channels.finish()
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self._held:
            text = self._held
            if self.state == "answer":
                out.append((CONTENT, text))
                self._held = ""
            elif self.state == "closed":  # the white space between the thinking and the answer is neither (llama.cpp's consume_spaces)
                self._held = text.lstrip()
                if self._held:
                    self.state = "answer"
            elif self.state == "start":  # before anything but white space: is it the opening marker?
                assert self.marks is not None
                lead = text.lstrip()
                if not lead and not final:
                    break
                if lead.startswith(self.marks.open):
                    self._held = lead[len(self.marks.open):]
                    self.state = "think"
                elif self.marks.open.startswith(lead) and not final:
                    break  # a marker cut short: wait for the rest
                else:
                    self.state = "answer"
            else:  # thinking: up to the closing marker
                assert self.marks is not None
                end = text.find(self.marks.close)
                if end >= 0:
                    if end:
                        out.append((REASONING, text[:end]))
                    self._held = text[end + len(self.marks.close):]
                    self.state = "closed"
                    continue
                keep = 0 if final else _partial_suffix(text, self.marks.close)
                if len(text) > keep:
                    out.append((REASONING, text[: len(text) - keep]))
                self._held = text[len(text) - keep:]
                break
        return merged(out)


def split(text: str, marks: Markers | None, *, started_open: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a whole reply."""
    s = Splitter(marks, started_open=started_open)
    parts = s.feed(text) + s.finish()
    reasoning = "".join(t for k, t in parts if k == REASONING)
    return (reasoning or None), "".join(t for k, t in parts if k == CONTENT)


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
