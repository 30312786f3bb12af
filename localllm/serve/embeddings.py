"""``POST /v1/embeddings``: OpenAI's request and response, served by the
process that serves chat (a second llama.cpp context on the same weights,
``localllm.engine.embed``, reached through the callables of ``Embeddings``).

OpenAI's fields: ``input`` (a string, a list of strings, a list of token ids
or a list of such lists; at most 2048 inputs, none empty), ``model``,
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


def _bad(field: str, what: str) -> RequestError:
    return RequestError(400, f"'{field}' {what}", param=field)


def _inputs(body: dict, n_vocab: int) -> list[str | list[int]]:
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise _bad("input", "must be a string, a list of strings, a list of token ids or a list of those lists")
    if len(raw) > MAX_INPUTS:
        raise _bad("input", f"holds {len(raw)} inputs; at most {MAX_INPUTS}")
    out: list[str | list[int]] = []
    for i, x in enumerate(raw):
        if isinstance(x, str):
            if not x:
                raise _bad("input", f"[{i}] is empty")
            out.append(x)
        elif isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
            if not all(0 <= t < n_vocab for t in x):
                raise _bad("input", f"[{i}] holds token ids outside the vocabulary (0..{n_vocab - 1})")
            out.append(list(x))
        else:
            raise _bad("input", f"[{i}] must be a non-empty string or list of token ids")
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
    texts = [x for x in inputs if isinstance(x, str)]
    tokenized = iter(await run_in_threadpool(lambda: [svc.tokenize(t) for t in texts]) if texts else [])
    token_lists = [x if isinstance(x, list) else next(tokenized) for x in inputs]
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
