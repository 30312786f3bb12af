"""``POST /v1/rerank`` (and llama-server's ``/rerank``, ``/reranking``,
``/v1/reranking``): llama-server's rerank API, served with ``--rerank`` (or
``--pooling rank``) by a context of its own on the served weights with rank
pooling (``localllm.engine.rank``, reached through the callables of ``Rerank``).

The request: ``query`` (a non-empty string), ``documents`` (1 to
``MAX_DOCUMENTS`` strings), ``top_n`` (an integer >= 0, default all) and
``model``. The answer is llama-server's (``format_response_rerank``):
``{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
"results": [{"index", "relevance_score"}]}``, the results sorted by score,
best first (ties in the documents' order), cut to ``top_n``; ``model`` is the
request's when it names one, as llama-server echoes it. Each score is the
first output of the model's classification head for the pair, exactly as
llama-server reads it. TEI's shape is served too, as llama-server serves it:
``texts`` in place of ``documents`` answers a bare list of ``{"index",
"score"}`` (with ``"text"`` when ``return_text`` is true). Other fields are
accepted and named in ``X-Ignored-Fields``.

Limits: llama-server takes any number of documents; here at most
``MAX_DOCUMENTS`` (a choice: RAG tools rerank tens to hundreds of retrieved
passages), so that one request cannot hold the engine thread for long (about
3 to 10 s for 1000 short pairs of the synthetic reranker here: an estimate
from its measured 100 to 300 documents/s) or make a response of unbounded size. Each pair must
fit the rank context (a pooled sequence is computed whole in one ubatch), as
llama-server's "input is too large to process" check; the query may not be
empty (llama-server scores an empty query; no reranker is trained for it).

What ``--rerank`` leaves of the rest of the API: everything, as llama-server,
which keeps its completion routes with ``--rerank``. A reranker built on a
decoder (Qwen3-Reranker) still generates (not tried here: no such GGUF on this
machine). An encoder (BERT: llama.cpp makes
no KV cache and no logits for it) answers the generation routes with a 400
saying so (serve/app.py, ``ServeState.no_generation``): llama.cpp would abort
the process there, where llama-server answers "the current context does not
support logits computation".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.errors import EngineError
from localllm.serve.protocol import RequestError, error_body

MAX_DOCUMENTS = 1000  # a request's documents at most (the module's docstring)
PATHS = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")  # llama-server's four (tools/server/server.cpp)
FIELDS = frozenset({"query", "documents", "texts", "top_n", "model", "return_text"})
NOT_STARTED = "This server does not support reranking. Start it with `--reranking`"  # llama-server's words


@dataclass(frozen=True)
class Rerank:
    pair: Callable[[str, str], list[int]]  # (query, document) -> the pair's tokens (thread-safe)
    batches: Callable[[Sequence[Sequence[int]]], list[list[Sequence[int]]]]  # pairs -> the batches of one decode each
    # batches -> a Future of the first ones' outputs (a list per batch, the head's outputs per pair), completed on the engine thread
    decode: Callable[[Sequence[Sequence[Sequence[int]]]], concurrent.futures.Future]
    n_ctx: int  # the longest pair, in tokens
    head: bool = True  # False: the model has no classification head, so its scores rank nothing (said in X-Rerank-Head: none)


INLINE_CHARS = 16384  # a request's text tokenized on the event loop up to this (about 4 ms here); more goes to a worker thread


def _bad(field: str, what: str) -> RequestError:
    return RequestError(400, f"'{field}' {what}", param=field)


def parse(body: dict) -> tuple[str, list[str], int | None, bool]:
    """(query, documents, top_n or None for all, TEI's shape) of a request body, or a 400 naming the field."""
    query = body.get("query")
    if not isinstance(query, str):
        raise _bad("query", "must be a string" if "query" in body else "must be provided")
    if not query:
        raise _bad("query", "is empty: give the text to rank the documents against")
    tei = "texts" in body and "documents" not in body
    field = "texts" if tei else "documents"
    docs = body.get(field)
    if not isinstance(docs, list) or not docs:
        raise _bad(field, "must be a non-empty array of strings")
    if len(docs) > MAX_DOCUMENTS:
        raise _bad(field, f"holds {len(docs)} documents; at most {MAX_DOCUMENTS} a request: send them in several requests")
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise _bad(field, f"[{i}] must be a string, got {type(d).__name__ if d is not None else 'null'}")
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise _bad("top_n", "must be an integer >= 0 (how many of the best documents to return)")
    if body.get("model") is not None and not isinstance(body.get("model"), str):
        raise _bad("model", "must be a string")
    if body.get("return_text") is not None and not isinstance(body.get("return_text"), bool):
        raise _bad("return_text", "must be true or false")
    return query, docs, top_n, tei


async def answer(body: dict, svc: Rerank, model_name: str) -> tuple[dict | list, int, tuple[str, ...]]:
    """The response body, the tokens read, and the fields no API defines (for X-Ignored-Fields)."""
    query, docs, top_n, tei = parse(body)
    field = "texts" if tei else "documents"

    def tokenize() -> list[list[int]]:
        pairs = [svc.pair(query, d) for d in docs]
        for i, toks in enumerate(pairs):
            if not toks:
                raise _bad(field, f"[{i}] makes a pair with no tokens")
            if len(toks) > svc.n_ctx:
                raise RequestError(400, f"{field}[{i}] with the query is {len(toks)} tokens but a pair may hold {svc.n_ctx} (the smallest "
                                   "of --ctx, --ubatch and the model's trained context): shorten it, or restart the server with larger ones",
                                   param=field, code="context_length_exceeded")
        return pairs

    # a small request is tokenized here, not in a worker thread: each thread handoff waits for a CPU on a loaded machine
    small = len(query) * len(docs) + sum(map(len, docs)) <= INLINE_CHARS
    pairs = tokenize() if small else await run_in_threadpool(tokenize)
    groups = svc.batches(pairs)
    scores: list[list[float]] = []
    done = 0
    while done < len(groups):  # slices of decodes on the engine thread, awaited here (engine/rank.py: decode_slice)
        got = await asyncio.wrap_future(svc.decode(groups[done:]))
        done += len(got)
        scores += [s for group in got for s in group]
    label = "score" if tei else "relevance_score"
    order = sorted(range(len(docs)), key=lambda i: -scores[i][0])  # stable: ties keep the documents' order
    results: list[dict] = []
    for i in order[:len(docs) if top_n is None else top_n]:
        item: dict = {"index": i, label: scores[i][0]}
        if tei and body.get("return_text"):
            item["text"] = docs[i]
        results.append(item)
    n = sum(map(len, pairs))
    ignored = tuple(sorted(k for k in body if k not in FIELDS))
    if tei:
        return results, n, ignored
    model = body.get("model") or model_name
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}, n, ignored


def routes(state, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The four rerank paths, over ``state`` (``app.ServeState``, untyped as in the other route modules: app
    imports them); without ``--rerank`` each answers 501 with llama-server's words."""

    async def rerank(request: Request) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        svc = state.rerank
        if svc is None:
            state.log(method, path, 501, "not started with --rerank")
            return JSONResponse(error_body(NOT_STARTED, kind="not_supported_error"), status_code=501)
        try:
            body = await read_json(request)
            out, n, ignored = await answer(body, svc, state.model_name)
        except RequestError as exc:
            state.log(method, path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        except EngineError as exc:
            state.log(method, path, 500, str(exc))
            return JSONResponse(error_body(f"the engine failed: {exc}", kind="server_error"), status_code=500)
        header = ", ".join(f[:40] for f in ignored[:20])
        n_docs = len(body.get("documents") or body.get("texts") or ())
        state.log(method, path, 200, f"{n_docs} documents, {n} tokens" + (f"; ignored fields: {header}" if header else ""))
        said = {**({"X-Ignored-Fields": header} if header else {}), **({} if svc.head else {"X-Rerank-Head": "none"})}
        return JSONResponse(out, headers=said)

    return [Route(p, rerank, methods=["POST"]) for p in PATHS]
