"""``POST /v1/embeddings``: OpenAI's request and response, served by the
process that serves chat (a second llama.cpp context on the same weights,
``localllm.engine.embed``, reached through the callables of ``Embeddings``).

OpenAI's fields: ``input`` (a string, a list of strings, a list of token ids
or a list of such lists; at most 2048 inputs, none empty; and llama-server's
forms: strings among token ids, ``{"prompt_string": ...}``, ``{"content":
[text parts]}``), ``model``,
``encoding_format`` (``float`` or ``base64``: little-endian float32, as
OpenAI sends; the ``openai`` client asks for it by default), ``dimensions``
(only the model's own: a 400 otherwise, as for a model that cannot shorten
its vectors) and ``user`` (no effect). llama-server's ``embd_normalize`` is
honoured at 2 (L2, the default) and refused otherwise. Other fields are
accepted and named, as on the completion routes. The response says which
pooling made the vectors (``"pooling": "mean"``): a chat model declares none.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from localllm.serve.protocol import RequestError

MAX_INPUTS = 2048  # OpenAI's limit
FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user", "embd_normalize"})


@dataclass(frozen=True)
class Embeddings:
    tokenize: Callable[[str], list[int]]  # text -> token ids (specials as text), run in a worker thread
    embed: Callable[[Sequence[Sequence[int]]], list[list[float]]]  # normalized vectors; run in a worker thread, it waits for each decode on the engine thread
    n_ctx: int  # the longest input, in tokens (--ctx and --ubatch)
    n_vocab: int
    n_embd: int
    pooling: str
    tokenize_piece: Callable[[str], list[int]] | None = None  # text -> ids without the model's specials (a piece among token ids)


def _bad(field: str, what: str) -> RequestError:
    return RequestError(400, f"'{field}' {what}", param=field)


def _is_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _text_of(x: dict, where: str) -> str:
    """llama-server's object prompts: ``{"prompt_string": text}``, or ``{"content": [text parts]}``
    (their texts joined as written: the parts of one text)."""
    if isinstance(x.get("prompt_string"), str):
        return x["prompt_string"]
    parts = x.get("content")
    if not isinstance(parts, list) or not parts:
        raise _bad("input", f"{where} must hold 'prompt_string' (a string) or 'content' (a list of text parts)")
    texts = []
    for k, p in enumerate(parts):
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            kind = p.get("type") if isinstance(p, dict) else None
            raise _bad("input", f"{where}.content[{k}] must be a text part ({{'type': 'text', 'text': ...}}); "
                       f"{kind!r} parts need a multimodal embedding model" if kind else f"{where}.content[{k}] must be a text part")
        texts.append(p["text"])
    return "".join(texts)


def _prompt(x: object, i: int, n_vocab: int) -> str | list[int | str]:
    """One input: a string, token ids, token ids mixed with strings (each string's
    tokens in its place, as llama-server's tokenize_mixed), or an object prompt."""
    if isinstance(x, dict):
        x = _text_of(x, f"[{i}]")
    if isinstance(x, str):
        if not x:
            raise _bad("input", f"[{i}] is empty")
        return x
    if isinstance(x, list) and x and all(_is_id(t) or isinstance(t, str) for t in x) and any(_is_id(t) for t in x):
        if not all(0 <= t < n_vocab for t in x if _is_id(t)):
            raise _bad("input", f"[{i}] holds token ids outside the vocabulary (0..{n_vocab - 1})")
        return list(x)
    raise _bad("input", f"[{i}] must be a non-empty string, a list of token ids (strings may stand among them) or a text object")


def _inputs(body: dict, n_vocab: int) -> list[str | list[int | str]]:
    raw = body.get("input")
    # one prompt: a string, an object, or a flat list with token ids in it (strings among ids are part of that prompt)
    if isinstance(raw, (str, dict)) or (isinstance(raw, list) and any(_is_id(t) for t in raw)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise _bad("input", "must be a string, a list of strings, a list of token ids or a list of those lists")
    if len(raw) > MAX_INPUTS:
        raise _bad("input", f"holds {len(raw)} inputs; at most {MAX_INPUTS}")
    return [_prompt(x, i, n_vocab) for i, x in enumerate(raw)]


def _tokens(x: str | list[int | str], svc: Embeddings) -> list[int]:
    """An input's token ids (in a worker thread): a string's with the model's specials,
    as llama-server's; in a mixed list, only a leading string gets them."""
    if isinstance(x, str):
        return svc.tokenize(x)
    out: list[int] = []
    for k, piece in enumerate(x):
        if isinstance(piece, str):
            out += svc.tokenize(piece) if k == 0 or svc.tokenize_piece is None else svc.tokenize_piece(piece)
        else:
            out.append(piece)
    return out


def _options(body: dict, n_embd: int) -> str:
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise _bad("encoding_format", "must be float or base64")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims != n_embd):
        raise _bad("dimensions", f"must be the model's own, {n_embd}: this server does not shorten embeddings")
    if body.get("model") is not None and not isinstance(body.get("model"), str):
        raise _bad("model", "must be a string")
    if body.get("embd_normalize") not in (None, 2):
        raise _bad("embd_normalize", "can only be 2 (Euclidean): vectors are always L2-normalized")
    return fmt


async def answer(body: dict, svc: Embeddings, model_name: str) -> tuple[dict, tuple[str, ...]]:
    """The response body, and the fields no API defines (for X-Ignored-Fields)."""
    inputs = _inputs(body, svc.n_vocab)
    fmt = _options(body, svc.n_embd)
    token_lists = await run_in_threadpool(lambda: [_tokens(x, svc) for x in inputs])
    for i, toks in enumerate(token_lists):
        if not toks:
            raise _bad("input", f"[{i}] has no tokens")
        if len(toks) > svc.n_ctx:
            raise RequestError(400, f"input[{i}] is {len(toks)} tokens but an input may hold {svc.n_ctx} (the smaller of --ctx "
                               "and --ubatch, as llama-server): shorten it, or restart the server with larger ones",
                               param="input", code="context_length_exceeded")
    vectors = await run_in_threadpool(svc.embed, token_lists)
    n = sum(len(t) for t in token_lists)
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, fmt)} for i, v in enumerate(vectors)]
    out = {"object": "list", "data": data, "model": model_name, "pooling": svc.pooling, "usage": {"prompt_tokens": n, "total_tokens": n}}
    return out, tuple(sorted(k for k in body if k not in FIELDS))


def _encode(v: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return v
    return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")
