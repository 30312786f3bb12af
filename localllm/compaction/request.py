"""How a summary is asked of the loaded model: a fixed instruction, rendered with
the model's own chat template, greedy and bounded.

The older turns go to the model as one user message holding a transcript
("User: ...", "Assistant: ..."), the instruction after it, where a small model
reads it last. The transcript is marked as data, so text in it that spells a
control token (a tool's result, an attached file) stays text, as it does in the
chat. Greedy sampling: the same conversation gives the same summary, and a
summary is no place for invention. A transcript longer than the context leaves
room for (a conversation the sliding window already shifted) loses its oldest
messages first.
"""

from __future__ import annotations

import re

from localllm.chat.session import ChatSession
from localllm.compaction.split import SUMMARY_LABEL, is_summary
from localllm.engine_api import Engine, SamplingConfig
from localllm.vision.marker import MARKER

SYSTEM = "You write short, faithful summaries of conversations."
ASK = ("Summarize the conversation above so that the assistant can continue it. Keep every name, number, code, date "
       "and decision exactly as written. Write only the summary.")
NAMES = {"user": "User", "assistant": "Assistant", "tool": "Tool result", "system": "Note"}
MARGIN = 8  # tokens of slack for the template's pieces around the transcript


def transcript(messages: list[dict[str, str]]) -> str:
    """The messages as plain text, one paragraph each, an earlier summary named as such."""
    parts = []
    for m in messages:
        text = str(m.get("content") or "")
        if is_summary(m):
            name, text = "Earlier summary", text[len(SUMMARY_LABEL):]
        else:
            name = NAMES.get(str(m.get("role")), str(m.get("role")))
        parts.append(f"{name}: {text.replace(MARKER, '[image]').strip()}")
    return "\n\n".join(parts)


def request_text(older: list[dict[str, str]]) -> str:
    return f"Conversation:\n\n{transcript(older)}\n\n{ASK}"


def fitted(backend: Engine, older: list[dict[str, str]], budget: int) -> str:
    """The request's text for ``older``, its oldest messages dropped (and then the
    last one's text cut) until it takes at most ``budget`` tokens."""
    def size(text: str) -> int:
        return len(backend.tokenize(text, add_special=False, parse_special=False))

    kept = list(older)
    text = request_text(kept)
    while size(text) > budget and len(kept) > 1:
        kept.pop(0)
        text = request_text(kept)
    while size(text) > budget and kept:
        body = str(kept[0].get("content") or "")
        cut = max(int(len(body) * budget / max(size(text), 1) * 0.9), 0)
        if cut >= len(body) or cut == 0:
            kept = []
            break
        kept[0] = {**kept[0], "content": body[-cut:]}  # the end: nearer to what is kept whole
        text = request_text(kept)
    return text if kept else ASK


def summarize(backend: Engine, older: list[dict[str, str]], max_tokens: int) -> str:
    """The model's summary of ``older`` (at most ``max_tokens`` tokens), a
    reasoning model's thinking taken out. Uses the engine's cache: the caller's
    conversation is read again afterwards."""
    # no thinking (a template's enable_thinking): the bound is for the summary, not for reasoning about it
    asker = ChatSession(backend, system_prompt=SYSTEM, sampling=SamplingConfig(temperature=0.0, max_tokens=max_tokens),
                        sliding_window=False, thinking=False)
    overhead = len(backend.tokenize(backend.render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]),
                                    add_special=False, parse_special=True))
    budget = max(backend.n_ctx - max_tokens - overhead - MARGIN, 1)
    reply = asker.send_messages([{"role": "user", "content": fitted(backend, older, budget), "data": "transcript"}])
    try:
        text = "".join(event.text for event in reply)
    finally:
        reply.close()
    return clean(text)


def clean(text: str) -> str:
    """A summary without a ``<think>`` block (closed, or cut off by the bound)."""
    text = re.sub(r"(?s)<think>.*?</think>", "", text)
    if "<think>" in text:
        text = text[: text.index("<think>")]
    return text.strip()
