"""``serve --compact-at FRACTION``: a chat request whose prompt fills that much of a
slot's context has its older turns replaced by a summary the served model writes,
the system prompt and the last turns kept whole (``localllm.compaction``'s split
and instruction, the chat's and the cockpit's).

A client sends the whole conversation with every request, so the summary is kept
by what it summarizes (the sha256 of those messages): the next request of the
same conversation, past the same turns, gets the same summary without a second
generation, and its compacted prompt starts as the last one's did, so the slot's
cached prefix is reused too. The summary is written on the scheduler like any
request (greedy, bounded, thinking off); the request it serves waits for it.

The summary joins the system prompt (after it, or as the system prompt where
there is none): every template takes a system prompt first. A reply says what
was done in ``X-Compacted`` (tokens before and after, and whether the summary
was written now or reused). Off by default, as in ``chat``: a client's
conversation is not changed unless the server was told to.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from localllm.compaction import KEEP_TURNS, compactable, split, summary_tokens
from localllm.compaction.request import ASK, SYSTEM, clean, transcript

__all__ = ["SYSTEM", "Compacted", "Compactor", "summary_sampling"]
from localllm.compaction.split import SUMMARY_LABEL
from localllm.engine_api import SamplingConfig

KEPT = 64  # summaries kept, by what they summarize


@dataclass
class Compacted:
    tokens: list[int]
    params: Any
    header: str  # X-Compacted


class Compactor:
    """``at``: the fraction of a slot's context (``n_ctx_seq``) that starts a compaction."""

    def __init__(self, at: float, n_ctx_seq: int, tokenize: Callable[[Any], list[int]], summary_prompt: Callable[[str], list[int]],
                 write: Callable[[list[int], int], Any]) -> None:
        self.at, self.n_ctx_seq = at, n_ctx_seq
        self._tokenize = tokenize  # a request's params as prompt tokens (serve's tokenizer)
        self._summary_prompt = summary_prompt  # the summary request's text as prompt tokens (the template, thinking off)
        self._write = write  # (prompt tokens, max tokens) -> awaitable text, on the scheduler
        self._kept: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, params: Any, tokens: list[int], run: Callable[..., Any]) -> Compacted | None:
        """The request compacted, or None (under the threshold, nothing to summarize, or no shorter)."""
        messages = params.messages
        if not params.chat or not messages or params.images or len(tokens) < self.at * self.n_ctx_seq:
            return None
        plain = [m for m in messages if isinstance(m.get("content"), str)]
        if len(plain) != len(messages) or not compactable(messages, KEEP_TURNS):
            return None
        parts = split(messages, KEEP_TURNS)
        key = hashlib.sha256(json.dumps(parts.older, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
        summary, how = self._kept.get(key), "reused"
        if summary is None:
            budget = summary_tokens(self.n_ctx_seq)
            prompt = await run(self._summary_prompt, self._request(parts.older, budget))
            summary, how = clean(await self._write(prompt, budget)), "written"
            if not summary:
                return None
            self._kept[key] = summary
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        note = SUMMARY_LABEL + summary
        head = parts.head
        system = [{**head[0], "content": f"{head[0]['content']}\n\n{note}"}] if head else [{"role": "system", "content": note}]
        shorter = replace(params, messages=system + parts.kept)
        new = await run(self._tokenize, shorter)
        if len(new) >= len(tokens):
            return None
        return Compacted(new, shorter, f"{len(tokens)} -> {len(new)} tokens, summary {how}")

    def _request(self, older: list[dict[str, str]], budget: int) -> str:
        """The summary request's text: the transcript's oldest messages dropped until the
        request leaves the summary its room in a slot (characters as a bound: 4 a token at most here)."""
        room = max((self.n_ctx_seq - budget - 64) * 3, 200)
        kept = list(older)
        text = f"Conversation:\n\n{transcript(kept)}\n\n{ASK}"
        while len(text) > room and len(kept) > 1:
            kept.pop(0)
            text = f"Conversation:\n\n{transcript(kept)}\n\n{ASK}"
        return text if len(text) <= room else f"Conversation:\n\n{transcript(kept)[-room:]}\n\n{ASK}"


def summary_sampling(max_tokens: int) -> SamplingConfig:
    """Greedy: the same conversation gives the same summary, and a summary is no place for invention."""
    return SamplingConfig(temperature=0.0, max_tokens=max_tokens, speculate="none")

