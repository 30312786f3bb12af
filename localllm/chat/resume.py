"""A saved conversation's KV cache, kept beside its session file, so that a
reopened conversation goes on without reading it again (issues 49 and 61).

Reading a conversation again costs one prefill of all of it: a 3,000-token chat
is seconds on a laptop CPU before the first token of the next reply, and with
images each image's encode comes on top (the vision encoder). Loading a state
file costs milliseconds. So when the cockpit leaves a conversation (it quits,
opens another session, starts a new chat) or ``chat`` ends, the KV cache is
written to ``<id>.state`` beside ``<id>.json``, in ``engine.kvcache``'s checked
format (this llama.cpp build, this model file, these cache types), and the
session records the sha256 of the text the cache stands for (the rendered
conversation), of each image's pixels (none for a text conversation), and the
cache's length in cells (``mark``). A state file is as large as the cache it
holds, so the files share a disk budget (``chat.kept``: the oldest go first).

Reopened, the state is loaded only if the conversation renders to that text now
and llama.cpp takes the file: a picture that changed on disk (its marker
dropped), an edited session, another template or another model give another
text or another file check, and the conversation is read again as before, with
one line that says why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.chat.session import ChatSession

_KEYS = ("text_sha256", "cells", "images")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def keep(chat: ChatSession, path: Path) -> dict[str, Any] | None:
    """Write ``chat``'s KV cache to ``path`` (engine thread) and return the
    session's mark for it, or None when there is nothing worth keeping (nothing
    cached, or a cache that is not the conversation's end)."""
    held = chat.held_text()
    if not held or held != chat.text_after_reply():
        return None
    chat.backend.save_state(path)
    return {"text_sha256": _sha(held), "cells": chat.context_used, "images": [im.sha256 for im in chat.images]}


def mark_of(value: Any) -> dict[str, Any] | None:
    """A session file's ``kv`` entry, checked (a session file is outside data):
    64-digit hex sha256s (none for the images of a text conversation) and a
    whole number of cells, else None."""
    if not isinstance(value, dict):
        return None
    sha, cells, images = value.get("text_sha256"), value.get("cells"), value.get("images")
    if not _is_sha(sha) or type(cells) is not int or cells <= 0:
        return None
    if not isinstance(images, list) or not all(_is_sha(x) for x in images):
        return None
    return {"text_sha256": sha, "cells": cells, "images": list(images)}


def _is_sha(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def resume(chat: ChatSession, path: Path, mark: dict[str, Any]) -> str | None:
    """Load the state at ``path`` into ``chat``'s engine (engine thread) when it
    stands for the conversation as it renders now: None when it did, else why
    not (the cache is then empty, and the next turn reads the conversation)."""
    text = chat.text_after_reply()
    if text is None or _sha(text) != mark.get("text_sha256"):
        return "it was saved for another text of the conversation"
    if [im.sha256 for im in chat.images] != mark.get("images"):
        return "it was saved with other images"
    if not path.is_file():
        return "its state file is gone"
    if not chat.backend.load_state(path):
        return f"its state file was {chat.backend.state_error or 'refused'}"
    if chat.context_used != mark.get("cells"):
        chat.backend.reset()
        return "its state file holds another length of the conversation"
    chat.adopt_cache(text)
    return None
