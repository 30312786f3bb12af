"""A reply's thinking, folded: told each token as it streams, it says which text
is the answer (shown) and which is the thinking (folded into one line), and
measures each apart: the thinking's tokens and time, and the time from the
user's Enter to the first answer token, TTFT's counterpart for a thinking model
(its TTFT proper is the first thinking token).

The split is ``localllm.reasoning``'s, the one serve's routes use, over the
markers the model's template writes; a template that does not think gives
every token to the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.reasoning import Markers, Splitter, markers


@dataclass(frozen=True)
class Thought:
    """The figures of one reply's thinking; None: not measured (no thinking, or no answer yet)."""

    text: str
    tokens: int | None
    ms: float | None
    answer_ms: float | None  # Enter to the first answer token

    def line(self) -> str:
        """The folded thinking, one line."""
        n = "n/a" if self.tokens is None else str(self.tokens)
        took = "n/a" if self.ms is None else f"{self.ms / 1000:.1f} s"
        return f"[thought for {n} tokens, {took}]"

    def to_dict(self) -> dict[str, object]:
        return {"reasoning": self.text or None, "reasoning_tokens": self.tokens, "reasoning_ms": self.ms, "answer_ttft_ms": self.answer_ms}


class Fold:
    """One reply. ``feed(text, t_ns)`` per token returns the answer's text now
    sure (the thinking is kept); ``finish()`` the rest and the ``Thought``."""

    def __init__(self, template: str | None, prompt_tail: str, start_ns: int) -> None:
        marks, opened = markers(template, prompt_tail)
        self.marks: Markers | None = marks
        self._split = Splitter(marks, started_open=opened)
        self._start = start_ns
        self._thinking: list[str] = []
        self._tokens = 0
        self._think_tokens = 0
        self._first_ns: int | None = None
        self._last_think_ns: int | None = None
        self._answer_ns: int | None = None
        self.said = False  # the front end has shown the answer's start (and the folded line before it)

    def thinking_so_far(self) -> Thought | None:
        """The thinking's figures up to now; None when the reply has not thought."""
        if not self._thinking:
            return None
        ms = (self._last_think_ns - self._first_ns) / 1e6 if self._last_think_ns is not None and self._first_ns is not None else None
        return Thought("".join(self._thinking), self._think_tokens, ms, None)

    def feed(self, text: str, t_ns: int) -> str:
        self._tokens += 1
        if self._first_ns is None:
            self._first_ns = t_ns
        return self._take(self._split.feed(text), t_ns)

    def finish(self, t_ns: int | None = None) -> tuple[str, Thought]:
        answer = self._take(self._split.finish(), t_ns)
        so_far = self.thinking_so_far()
        if so_far is None:
            return answer, Thought("", None, None, self._ms(self._answer_ns))
        return answer, Thought(so_far.text, so_far.tokens, so_far.ms, self._ms(self._answer_ns))

    def _take(self, parts: list[tuple[str, str]], t_ns: int | None) -> str:
        out = []
        for kind, text in parts:
            if kind == "reasoning":
                self._thinking.append(text)
                self._think_tokens = self._tokens
                self._last_think_ns = t_ns if t_ns is not None else self._last_think_ns
            elif text:
                if self._answer_ns is None and text.strip():
                    self._answer_ns = t_ns
                out.append(text)
        return "".join(out)

    def _ms(self, t_ns: int | None) -> float | None:
        return None if t_ns is None else (t_ns - self._start) / 1e6
