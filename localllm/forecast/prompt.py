"""A message's tokens before it is sent, and whether it fits: for ``chat``,
``run`` and the cockpit alike (which call this, never the CLI's helpers).

The counts are the model's tokenizer's (an ``Engine``): an attachment's block as
plain text (as the session tokenizes a message marked data), a chat message as
the difference the template's rendering makes to the conversation (its text and
the turn markers around it), which is what the session appends to the cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from localllm.attach import Attachment, block
from localllm.engine_api import Engine
from localllm.forecast.room import Room, check

REPLY_ROOM = 1024  # tokens kept free for the reply when -n sets none (our choice; at most a quarter of the context)


def reply_room(n_predict: int, n_ctx: int) -> int:
    """What the reply may take: ``-n N``, or ``REPLY_ROOM`` (at most a quarter of the context)."""
    return n_predict if n_predict > 0 else min(REPLY_ROOM, n_ctx // 4)


def count(engine: Engine, attachments: Sequence[Attachment]) -> list[Attachment]:
    """Each attachment with its block's tokens (the model's tokenizer, as plain text): the chip's figure."""
    return [a.with_tokens(len(engine.tokenize(block(a), add_special=False, parse_special=False))) for a in attachments]


def new_tokens(engine: Engine, messages: Sequence[dict[str, Any]], new: dict[str, Any]) -> int:
    """The tokens ``new`` adds to the conversation ``messages`` as the chat
    template renders it (its text and the template's wrapping); a message of
    data (a tool's result, attached files) counted as the session tokenizes it,
    its control-token text as plain text (``chat/untrusted.py``). Exact for a
    first message; after a reply, a token or two under: the reply's last sampled
    token is not in the cache yet (it is evaluated with the next message), and
    the reply's text tokenized again need not split as it was sampled."""
    def n(ms: list[dict[str, Any]], gen: bool) -> int:
        if not ms:
            return 0
        return len(engine.tokenize(engine.render_chat(ms, add_generation_prompt=gen), add_special=False, parse_special=True))

    diff = n([*messages, new], True) - n(list(messages), False)
    if new.get("data") or new.get("role") == "tool":  # the session tokenizes such a message's text as plain text
        c = str(new.get("content") or "")
        diff += len(engine.tokenize(c, add_special=False, parse_special=False)) - len(engine.tokenize(c, add_special=False, parse_special=True))
    return max(diff, 0)


def names(attachments: Sequence[Attachment]) -> str:
    """``a.md, b.pdf, c.csv and 2 more``: the files a refusal names."""
    return ", ".join(a.name for a in attachments[:3]) + (f" and {len(attachments) - 3} more" if len(attachments) > 3 else "")


def check_message(engine: Engine, messages: Sequence[dict[str, Any]], new: dict[str, Any], *, n_predict: int,
                  max_ctx_by_kv_type: Mapping[str, int], trained_ctx: int | None = None,
                  attachments: Sequence[Attachment] = ()) -> tuple[Room, str | None]:
    """A chat message against the context: its ``Room`` (new tokens, what the
    cache holds, the reply's room) and the one line to refuse it with, naming
    the ``--ctx`` and KV cache type that would hold it (None: it fits).
    ``max_ctx_by_kv_type``: the load's fit's table (``Fit.max_ctx_by_kv_type``)."""
    room = Room(new_tokens(engine, messages, new), engine.context_used, reply_room(n_predict, engine.n_ctx), engine.n_ctx)
    what = f"the message with {names(attachments)}" if attachments else "the message"
    return room, check(room, max_ctx_by_kv_type, trained_ctx=trained_ctx, what=what)
