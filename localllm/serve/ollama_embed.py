"""Ollama's embedding routes over the engine that serves ``/v1/embeddings``
(``serve.embeddings.Embeddings``: a second context on the same weights).

- ``POST /api/embed``: ``{"model", "input": str | [str], "truncate", "options",
  "keep_alive", "dimensions"}`` to ``{"model", "embeddings": [[...]],
  "total_duration", "load_duration", "prompt_eval_count"}``. The vectors are
  L2-normalized, as Ollama's; ``dimensions`` below the model's keeps the first
  ones and normalizes them again (Ollama's way); an input past the context is
  cut to it unless ``truncate`` is false (then a 400); no input at all is
  Ollama's way to load the model (``embeddings: []``).
- ``POST /api/embeddings`` (Ollama's older route): ``{"model", "prompt"}`` to
  ``{"embedding": [...]}``, normalized too (Ollama's own gives the raw vector;
  this engine pools and normalizes in one step).

Errors are Ollama's ``{"error": "..."}``. ``keep_alive`` has no effect here
(one model, loaded until serve stops; the router acts on it), nor have
``options``, which are named in ``X-Ignored-Fields`` as on the other Ollama routes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.errors import EngineError
from localllm.serve.embeddings import MAX_INPUTS, Embeddings
from localllm.serve.ollama import tagged
from localllm.serve.protocol import RequestError

PATHS = ("/api/embed", "/api/embeddings")
EMBED_FIELDS = frozenset({"model", "input", "truncate", "dimensions", "options", "keep_alive"})
LEGACY_FIELDS = frozenset({"model", "prompt", "options", "keep_alive"})


def _bad(field: str, why: str) -> RequestError:
    return RequestError(400, f"'{field}' {why}", param=field)


def _inputs(raw: object) -> list[str]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise _bad("input", "must be a string or a list of strings")
    if len(raw) > MAX_INPUTS:
        raise _bad("input", f"holds {len(raw)} inputs; at most {MAX_INPUTS}")
    for i, x in enumerate(raw):
        if not x:
            raise _bad(f"input[{i}]", "is empty")
    return list(raw)


def _normalized(v: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v] if norm > 0 else v


async def vectors(texts: list[str], svc: Embeddings, *, truncate: bool, field: str) -> tuple[list[list[float]], int]:
    """(each text's normalized vector, the tokens read); an input past the context is cut
    to it when ``truncate``, else a 400 naming the limit."""
    token_lists = await run_in_threadpool(lambda: [svc.tokenize(t) for t in texts])
    for i, toks in enumerate(token_lists):
        where = f"{field}[{i}]" if field == "input" else field
        if not toks:
            raise _bad(where, "has no tokens")
        if len(toks) > svc.n_ctx:
            if not truncate:
                raise RequestError(400, f"'{where}' is {len(toks)} tokens but an input may hold {svc.n_ctx} (the smaller of --ctx and --ubatch): "
                                   "send truncate: true to cut it, or shorten it", param=field, code="context_length_exceeded")
            token_lists[i] = toks[: svc.n_ctx]
    out = await run_in_threadpool(svc.embed, token_lists)
    return out, sum(len(t) for t in token_lists)


async def embed(body: dict, svc: Embeddings, model: str) -> dict:
    """``/api/embed``'s answer to ``body``."""
    start = time.perf_counter_ns()
    texts = _inputs(body.get("input"))
    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise _bad("truncate", "must be true or false")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 0):
        raise _bad("dimensions", "must be a whole number (0: the model's own)")
    vecs, n = await vectors(texts, svc, truncate=truncate is not False, field="input") if texts else ([], 0)
    if dims and dims < svc.n_embd:
        vecs = [_normalized(v[:dims]) for v in vecs]
    return {"model": model, "embeddings": vecs, "total_duration": time.perf_counter_ns() - start, "load_duration": None,
            "prompt_eval_count": n}


async def embeddings(body: dict, svc: Embeddings) -> dict:
    """``/api/embeddings``'s answer to ``body``: an empty prompt loads the model, as Ollama's."""
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _bad("prompt", "must be a string")
    if not prompt:
        return {"embedding": []}
    vecs, _ = await vectors([prompt], svc, truncate=False, field="prompt")
    return {"embedding": vecs[0]}


def routes(state, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The two routes, over ``state`` (``app.ServeState``)."""

    async def answer(request: Request, legacy: bool) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        try:
            if state.embeddings is None:
                no = getattr(state, "no_embeddings", None)
                raise RequestError(400, no) if no else RequestError(404, "this server does not serve embeddings")
            body = await read_json(request)
            if not isinstance(body.get("model", ""), str):
                raise _bad("model", "must be a string")
            out = await (embeddings(body, state.embeddings) if legacy else embed(body, state.embeddings, tagged(state.model_name)))
        except RequestError as exc:
            state.log(method, path, exc.status, exc.message)
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        except EngineError as exc:
            state.log(method, path, 500, str(exc))
            return JSONResponse({"error": f"the engine failed: {exc}"}, status_code=500)
        known = LEGACY_FIELDS if legacy else EMBED_FIELDS
        opts = body.get("options")
        ignored = [k for k in body if k not in known] + ([f"options.{k}" for k in opts] if isinstance(opts, dict) else [])
        header = ", ".join(f[:40] for f in ignored[:20])
        n = 1 if legacy and out["embedding"] else 0 if legacy else len(out["embeddings"])
        state.log(method, path, 200, f"{n} inputs" + (f"; ignored fields: {header}" if header else ""))
        return JSONResponse(out, headers={"X-Ignored-Fields": header} if header else {})

    async def api_embed(request: Request) -> Response:
        return await answer(request, legacy=False)

    async def api_embeddings(request: Request) -> Response:
        return await answer(request, legacy=True)

    return [Route("/api/embed", api_embed, methods=["POST"]), Route("/api/embeddings", api_embeddings, methods=["POST"])]
