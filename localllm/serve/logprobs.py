"""Token log-probabilities in the shapes clients read them.

The engine thread emits one ``("logprob", (id, bytes, logprob, top))`` per
generated token (``top``: ``[(id, bytes, logprob)]``, best first), of the
model's distribution before sampling (``localllm.engine.logprobs``). This
module shapes them:

- chat ``logprobs``/``top_logprobs``: OpenAI's ``{"content": [{token, logprob,
  bytes, top_logprobs}]}``;
- llama-server's ``n_probs`` on the same routes: that shape with each token's
  ``id`` too, as llama-server answers (``probs_vector_to_json`` in
  tools/server/server-task.cpp);
- the legacy completions ``logprobs`` (an int): ``{tokens, token_logprobs,
  top_logprobs, text_offset}``.
"""

from __future__ import annotations

Raw = tuple[int, bytes, float, list[tuple[int, bytes, float]]]


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def content(raw: list[Raw], n_top: int, *, ids: bool, post: bool = False) -> list[dict]:
    """Entries of ``logprobs.content``: each token with its ``n_top`` alternatives;
    ``post``: the values are probabilities after the samplers, written ``prob`` and
    ``top_probs`` as llama-server writes them with ``post_sampling_probs``."""
    key, tops = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    out = []
    for tok, b, lp, top in raw:
        e: dict = {"id": tok} if ids else {}
        e.update({"token": _text(b), key: lp, "bytes": list(b)})
        e[tops] = [{**({"id": t} if ids else {}), "token": _text(tb), key: v, "bytes": list(tb)} for t, tb, v in top[:n_top]]
        out.append(e)
    return out


def legacy(raw: list[Raw], n_top: int, offset: int) -> dict:
    """The completions API's ``logprobs`` object; ``offset``: characters of the reply before these tokens."""
    tokens, offsets = [], []
    for _, b, _, _ in raw:
        offsets.append(offset)
        tokens.append(_text(b))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, _, lp, _ in raw],
        "top_logprobs": [{_text(tb): v for _, tb, v in top[:n_top]} for _, _, _, top in raw],
        "text_offset": offsets,
    }


def top_needed(chat_n: int | None, n_probs: int | None) -> int | None:
    """How many alternatives the engine must report per token; None: no log-probabilities asked."""
    asked = [n for n in (chat_n, n_probs) if n is not None]
    return max(asked) if asked else None
