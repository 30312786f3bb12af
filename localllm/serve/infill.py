"""llama-server's ``POST /infill``: fill in the middle, for editors' completion plugins.

The prompt is built from the model's FIM tokens token for token as llama-server
builds it (tools/server/server-common.cpp, ``format_prompt_infill``; the checks
are its ``post_infill`` in server-context.cpp), then generated and answered as
``/completion`` is (``llama_routes.LLAMA_COMPLETION`` through the app's
``generate``: the same scheduler, sampler and shapes, streamed or not).

The repository-level layout (arXiv 2409.12186), when the vocabulary has FIM_REP
and FIM_SEP::

    [FIM_REP]myproject\\n[FIM_SEP]{filename}\\n{text}...[FIM_SEP]filename\\n
    [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

(``--spm-infill``: suffix before prefix). Without FIM_SEP each extra chunk
follows a "--- snippet ---" line. The prefix keeps its last 3/4 of ``--batch``
tokens, the suffix its first ``--batch``/4 less the prompt and two; the extra
context keeps its last ``n_ctx - n_batch - 2*n_predict`` tokens (``n_predict``:
serve's ``-n``, -1 when unset, as llama-server's ``params.n_predict``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve.llama_routes import CompletionShaper, Generate, ModelFacts, parse_completion
from localllm.serve.protocol import Dialect, Finished, GenParams, RequestError

if TYPE_CHECKING:
    from localllm.engine.fim import FimTokens

# Editors send a ring of recent chunks (llama.vim's ring_n_chunks is 16 by default); far
# more is a client gone wrong, refused before any tokenizing (llama-server sets no limit).
MAX_EXTRA_CHUNKS = 1024
FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt")  # /infill's own; the rest are /completion's
REPO = "myproject\n"  # llama-server's fixed project name ("TODO: make project name an input")
FILE = "filename\n"  # and the current file's ("TODO: current filename")
SNIPPET = "\n\n--- snippet ---\n\n"  # its chunk separator without FIM_SEP (k_chunk_prefix_str)

Mixed = str | tuple[str | int, ...]  # a text, or texts and token ids (llama-server's tokenize_mixed)
Tokenize = Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special)


@dataclass(frozen=True)
class Infill:
    """An /infill body's own fields, checked."""

    prefix: Mixed
    suffix: Mixed
    extra: tuple[tuple[str, str], ...]  # (filename, text) per chunk
    prompt: str


def parse(body: dict, n_vocab: int) -> Infill:
    """The fields as ``post_infill`` checks them: ``input_prefix`` and ``input_suffix``
    required (a string, or a list of strings and token ids), ``prompt`` a string,
    ``input_extra`` a list of ``{"text": string, "filename": string}`` (filename
    optional, "tmp" then). 400 naming the field otherwise."""
    prompt = body.get("prompt")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise RequestError(400, "'prompt' must be a string", param="prompt")
    prefix, suffix = (_mixed(body, key, n_vocab) for key in ("input_prefix", "input_suffix"))
    raw = body.get("input_extra")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise RequestError(400, "'input_extra' must be a list of {\"filename\": string, \"text\": string}", param="input_extra")
    if len(raw) > MAX_EXTRA_CHUNKS:
        raise RequestError(400, f"'input_extra' has {len(raw)} chunks: at most {MAX_EXTRA_CHUNKS}", param="input_extra")
    extra = []
    for i, chunk in enumerate(raw):
        text = chunk.get("text") if isinstance(chunk, dict) else None
        if not isinstance(text, str):
            raise RequestError(400, f"'input_extra[{i}]' must be an object with a \"text\" field holding a string", param=f"input_extra[{i}].text")
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise RequestError(400, f"'input_extra[{i}].filename' must be a string", param=f"input_extra[{i}].filename")
        extra.append((filename, text))
    return Infill(prefix=prefix, suffix=suffix, extra=tuple(extra), prompt=prompt)


def _mixed(body: dict, key: str, n_vocab: int) -> Mixed:
    if key not in body:
        raise RequestError(400, f"'{key}' is required", param=key)
    v = body[key]
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and 0 <= p < n_vocab) for p in v):
        return tuple(v)
    raise RequestError(400, f"'{key}' must be a string (or a list of strings and token ids of this model, 0..{n_vocab - 1})", param=key)


def _tokens(tokenize: Tokenize, value: Mixed) -> list[int]:
    """``tokenize_mixed(vocab, value, false, false)``: texts without special tokens, ids as they are."""
    if isinstance(value, str):
        return tokenize(value, False, False)
    out: list[int] = []
    for p in value:
        if isinstance(p, str):
            out += tokenize(p, False, False)
        else:
            out.append(p)
    return out


def build_prompt(fim: FimTokens, tokenize: Tokenize, req: Infill, *, n_batch: int, n_ctx: int, n_predict: int, spm: bool) -> list[int]:
    """The prompt's token ids, as ``format_prompt_infill`` makes them (its order of
    insertions, its budgets, its truncations), ``fim`` having pre, suf and mid."""
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None  # checked by the route (FimTokens.missing)
    prompt = tokenize(req.prompt, False, True)  # tokenize_input_prompts(..., add_special false, parse_special true)
    prefix, suffix = _tokens(tokenize, req.prefix), _tokens(tokenize, req.suffix)
    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *tokenize(REPO, False, False)]
    for filename, text in req.extra:
        if fim.sep is not None:
            extra += [fim.sep, *tokenize(filename + "\n", False, False)]
        else:
            extra += tokenize(SNIPPET, False, False)
        extra += tokenize(text, False, False)
    if fim.sep is not None:
        extra += [fim.sep, *tokenize(FILE, False, False)]
    # the FIM context fits a batch, prefix:suffix 3:1; the extra chunks fill the rest of the context
    n_prefix_take = min(len(prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    head = [fim.pre, *prefix[len(prefix) - n_prefix_take:], *prompt]
    tail = [fim.suf, *suffix[:n_suffix_take]]
    first, end = (tail, head) if spm else (head, tail)
    if fim.bos is not None:
        first = [fim.bos, *first]
    return [*extra[len(extra) - n_extra_take:], *first, *end, fim.mid]


class InfillShaper(CompletionShaper):
    """``/completion``'s reply, its ``prompt`` the prompt built, as text (llama-server's
    answer detokenizes the prompt, special tokens written out)."""

    def __init__(self, chat: bool, model: str, params: GenParams, text: str) -> None:
        super().__init__(chat, model, params)
        self.text = text

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        return {**super().full(text, job, calls, index=index, logprobs=logprobs), "prompt": self.text}


def routes(state, generate: Generate, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """``POST /infill`` over ``state`` (``app.ServeState``) and the app's ``generate``."""

    async def infill(request: Request) -> Response:
        try:
            facts: ModelFacts | None = state.facts
            if facts is None:
                raise RequestError(503, "the model's details are not available", kind="unavailable_error")
            fim = facts.fim
            missing = ["prefix token is missing", "suffix token is missing", "middle token is missing"] if fim is None else fim.missing()
            if missing:  # llama-server answers 501 not_supported_error; the request cannot succeed here: a 400 naming why
                raise RequestError(400, f"Infill is not supported by this model: {'. '.join(missing)}. It has no fill-in-the-middle "
                                   "tokens (llama_vocab_fim_pre/suf/mid): use a code model trained for infill", kind="not_supported_error")
            assert fim is not None
            body = await read_json(request)
            req = parse(body, state.n_vocab)
            max_tokens = state.defaults.max_tokens
            tokens = await run_in_threadpool(build_prompt, fim, facts.tokenize, req, n_batch=facts.n_batch, n_ctx=state.n_ctx_seq,
                                             n_predict=max_tokens if max_tokens > 0 else -1, spm=facts.spm_infill)
            text = await run_in_threadpool(facts.prompt_text, tokens)
        except RequestError as exc:
            request.scope["localllm.logged"] = True
            state.log(request.method, request.url.path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        rest = {k: v for k, v in body.items() if k not in FIELDS}
        dialect = Dialect(parse_completion, lambda chat, model, params: InfillShaper(chat, model, params, text))
        return await generate(request, False, dialect, body={**rest, "prompt": tokens})

    return [Route("/infill", infill, methods=["POST"])]

