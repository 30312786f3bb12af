"""A ``ChatSession`` compacted: its older turns replaced by the model's summary,
measured (tokens before and after, seconds).

Where the summary goes. Templates disagree on what may follow the system
prompt: ChatML (SmolLM2, Qwen) and Llama 3 take a second system message, which
says best what a summary is (context the user did not type); Gemma's and
Mistral's raise on any role out of the user/assistant alternation, and some
templates drop a system message that is not the first without a word. So the
places are tried in that order, each rendered with the model's own template and
taken only if it renders and the summary is in the text: a second system
message; a user message; last, the system prompt's own message with the
summary after it (which every template with a system prompt takes, but which
changes the system prompt's text, so its KV state is no longer saved to disk).

Afterwards the compacted conversation is read into the cache at once (the
reading counts in the seconds), so the context figure is right and the next
reply's TTFT pays for its own message only; a conversation the chat must
tokenize with care (images, a file or tool result holding control-token text)
is left to the next turn, which reads it as it reads any conversation.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from localllm.chat import untrusted
from localllm.chat.session import ChatSession
from localllm.compaction.request import summarize
from localllm.compaction.rule import KEEP_TURNS, summary_tokens
from localllm.compaction.split import SUMMARY_LABEL, compactable, split
from localllm.errors import LocalLLMError, UsageError
from localllm.util import fmt
from localllm.vision.marker import MARKER

Messages = list[dict[str, str]]


class NotCompacted(LocalLLMError):
    """The model's summary could not take the older turns' place (empty, no
    shorter, or no place in the template for it): the conversation is as it was."""


@dataclass(frozen=True)
class Compaction:
    """One compaction's figures: the conversation's tokens as the model reads it
    before and after, the seconds it took (the summary written, the result read),
    what was summarized and where the summary went."""

    tokens_before: int
    tokens_after: int
    seconds: float
    summary_seconds: float
    summary: str
    summarized: int  # messages replaced by the summary
    kept_turns: int
    role: str  # "system", "user", or "system prompt" (appended to it)

    def line(self) -> str:
        """``compacted: 1,734 → 412 tokens in 3.2 s (12 messages summarized, the last 2 turns kept)``."""
        return (f"compacted: {self.tokens_before:,} → {self.tokens_after:,} tokens in {fmt.num(self.seconds, 1)} s "
                f"({self.summarized} messages summarized, the last {self.kept_turns} turns kept)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _render(chat: ChatSession, messages: Messages) -> str:
    """The conversation as the chat itself renders it (its template with its tools,
    rewrite and thinking switch): the cache read here must stand for the very text
    the chat's next turn extends, or that turn would read everything again."""
    return chat._render(messages, add_generation_prompt=False)  # noqa: SLF001 - the one rendering, not a copy of it


def _tokens(chat: ChatSession, text: str) -> list[int]:
    return chat.backend.tokenize(text, add_special=False, parse_special=True)


def _accepts(chat: ChatSession, messages: Messages) -> bool:
    try:
        return SUMMARY_LABEL.strip() in _render(chat, messages)
    except Exception:  # noqa: BLE001 - a template's raise_exception, or any failure of it: this place is not taken
        return False


def _place(chat: ChatSession, head: Messages, text: str, kept: Messages, data: bool) -> tuple[Messages, str]:
    """The compacted conversation and where its summary went (module docstring)."""
    extra = {"data": "summary"} if data else {}
    message = {"role": "system", "content": SUMMARY_LABEL + text, **extra}
    places: list[tuple[str, Messages]] = [("system", [*head, message, *kept]), ("user", [*head, {**message, "role": "user"}, *kept])]
    if head:
        places.append(("system prompt", [{**head[0], "content": f"{head[0]['content']}\n\n{SUMMARY_LABEL}{text}"}, *kept]))
    for role, messages in places:
        if _accepts(chat, messages):
            return messages, role
    raise NotCompacted("the model's chat template takes a summary nowhere (not as a system or user message, nor after the system "
                      "prompt): compaction cannot be used with it; the sliding window still applies")


def _unmerged(head: Messages) -> tuple[Messages, Messages]:
    """A system prompt that carries an earlier summary (the last place): the prompt, and the summary as a message of its own."""
    if not head:
        return head, []
    content = str(head[0].get("content") or "")
    at = content.find("\n\n" + SUMMARY_LABEL)
    if at < 0:
        return head, []
    return [{**head[0], "content": content[:at]}], [{"role": "system", "content": content[at + 2:]}]


def _careful(chat: ChatSession, messages: Messages) -> bool:
    """Whether the chat must tokenize ``messages`` itself: images (libmtmd), or
    data holding control-token text (its untrusted spans)."""
    if chat.images or any(MARKER in str(m.get("content") or "") for m in messages):
        return True
    return any((m.get("role") in untrusted.UNTRUSTED_ROLES or m.get("data")) and untrusted.holds_special(chat.backend, str(m.get("content") or ""))
               for m in messages)


def compact(chat: ChatSession, *, keep_turns: int = KEEP_TURNS, max_tokens: int | None = None) -> Compaction | None:
    """Replace ``chat``'s turns before the last ``keep_turns`` with a summary the
    model writes (at most ``max_tokens``, default ``rule.summary_tokens``); None
    when there is nothing before them to summarize. Runs on the engine's
    thread: it generates. On a failure the conversation is as it was (read
    again at the next turn)."""
    if chat.completion:
        raise UsageError("compaction needs a chat template (this is completion mode, which continues one text): start a new chat instead")
    start = time.perf_counter()
    messages = list(chat.messages)
    if not compactable(messages, keep_turns):
        return None
    parts = split(messages, keep_turns)
    head, earlier = _unmerged(parts.head)
    before = len(_tokens(chat, _render(chat, messages)))
    backend = chat.backend
    bound = max_tokens if max_tokens is not None else summary_tokens(chat.n_ctx)
    read = False
    try:
        text = summarize(backend, earlier + parts.older, bound)
        summary_s = time.perf_counter() - start
        if not text:
            raise NotCompacted("the model wrote an empty summary: nothing compacted (the sliding window still applies)")
        new, role = _place(chat, head, text, parts.kept, untrusted.holds_special(backend, text))
        rendered = _render(chat, new)
        tokens = _tokens(chat, rendered)
        if len(tokens) >= before:
            raise NotCompacted(f"with the summary the conversation would take {len(tokens):,} tokens, not fewer than its {before:,}: "
                               "nothing compacted (the turns before the last ones are too short to gain from it)")
        gone = sum(str(m.get("content") or "").count(MARKER) for m in parts.older)
        chat.messages = new
        chat.images = chat.images[gone:]  # the summarized messages' pictures go with them (their markers come first)
        if role == "system prompt":
            chat.prompt_cache = None  # the saved state stands for the system prompt alone
        backend.reset()
        if not _careful(chat, new) and len(tokens) < chat.n_ctx:
            backend.prefill(tokens)
            chat.adopt_cache(rendered)
            read = True
    finally:
        if not read:
            backend.reset()  # the cache held the summary's request: the next turn reads the conversation again
        for turn in chat.turns:
            turn.before = None  # what rewind went back to is gone from the cache
    return Compaction(before, len(tokens), time.perf_counter() - start, summary_s, text, len(parts.older), keep_turns, role)
