"""llama-server's own routes, so that its clients work unchanged: ``/completion``
(its request fields and reply shape, streamed as it streams), ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props`` and ``/slots``.

Field names and shapes follow llama.cpp's tools/server (server-context.cpp,
server-task.cpp) as vendored in the pinned llama-cpp-python;
``tests/serve/llama_server_answers.json`` holds its real answers, recorded,
and the tests compare keys against them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.engine_api.errors import SettingError
from localllm.errors import InputError
from localllm.serve.protocol import DEFAULTS, FINGERPRINT, OPENAI, Dialect, Finished, GenParams, RequestError, Shaper, error_body, parse_gen
from localllm.serve.tools import GENERIC, Format
from localllm.vision.marker import MARKER

if TYPE_CHECKING:
    from localllm.engine.fim import FimTokens


@dataclass(frozen=True)
class ModelFacts:
    """What llama-server's and Ollama's informational routes report of the
    loaded model, and the vocabulary's functions they call (in a worker thread)."""

    path: str
    n_parallel: int
    chat_template: str  # "" for none
    bos_token: str
    eos_token: str
    architecture: str
    file_type: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_embd: int
    tokenize: Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special)
    piece: Callable[[int], bytes]
    # the chat template, with the generation prompt: (messages, tools, a request's template variables over serve's)
    render: Callable[..., str]
    prompt_text: Callable[[list[int]], str]  # token ids as llama-server writes a prompt (special tokens written out)
    fim: FimTokens | None = None  # the vocabulary's fill-in-the-middle tokens (engine/fim.py), for /infill (serve/infill.py)
    n_batch: int = 2048  # serve's --batch: /infill's budgets, as llama-server's params.n_batch
    spm_infill: bool = False  # serve's --spm-infill: /infill puts the suffix first
    context: str = ""  # a request's context and why, "32768 (trained)" (plan.fitting.context_why): Ollama's /api/ps
    eog: Callable[[], tuple[int, ...]] | None = None  # the vocabulary's end-of-generation tokens (found on first use)


# what /apply-template reads of a chat body: what shapes the prompt
APPLY_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort", "add_generation_prompt",
                "continue_final_message")
Handler = Callable[[Request], Awaitable[Response]]
MAX_PROMPTS = 64  # prompts in one /completion body (llama-server has no bound; each is a request of its own)
Generate = Callable[..., Awaitable[Response]]


def _answers(handler: Handler) -> Handler:
    """A ``RequestError`` raised by the handler becomes its JSON error."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)

    return wrapped


def _flag(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if not isinstance(v, bool):
        raise RequestError(400, f"'{key}' must be true or false", param=key)
    return v


def _utf8_or_bytes(b: bytes) -> str | list[int]:
    """A piece as llama-server gives it: text, or its bytes when not valid UTF-8 alone."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def routes(state, generate: Generate, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The routes, over ``state`` (``app.ServeState``) and the app's ``generate``."""

    def facts() -> ModelFacts:
        if state.facts is None:
            raise RequestError(503, "the model's details are not available", kind="unavailable_error")
        return state.facts

    async def completion(request: Request) -> Response:
        """llama-server's prompt forms (its tokenize_input_prompts): a string, token
        ids, strings among token ids (one prompt), ``{"prompt_string": ...}``, or a
        list of those (several prompts: a list of replies, in order)."""
        body = await read_json(request)
        prompts = await prompt_forms(body.get("prompt"))
        if prompts is None:
            return await generate(request, False, LLAMA_COMPLETION, body=body)
        if len(prompts) == 1:
            return await generate(request, False, LLAMA_COMPLETION, body={**body, "prompt": prompts[0]})
        if body.get("stream"):
            raise RequestError(400, "several prompts are answered whole: send 'stream': false, or one prompt a request", param="stream")
        if len(prompts) > MAX_PROMPTS:
            raise RequestError(400, f"'prompt' holds {len(prompts)} prompts; at most {MAX_PROMPTS} a request", param="prompt")
        answers = await asyncio.gather(*(generate(request, False, LLAMA_COMPLETION, body={**body, "prompt": p}) for p in prompts))
        for a in answers:
            if a.status_code != 200:
                return a
        return JSONResponse([json.loads(bytes(a.body)) for a in answers])

    async def prompt_forms(p: object) -> list[str | list[int]] | None:
        """The prompts of a /completion body in forms ``generate`` reads; None: as given (a string, ids, or a bad value it names)."""
        def one(x: object) -> str | list[int]:
            if isinstance(x, dict):
                if x.get("multimodal_data"):
                    raise RequestError(400, "'prompt' has multimodal_data: this server reads images in chat messages "
                                       "(/v1/chat/completions image_url parts), with --mmproj", param="prompt")
                if not isinstance(x.get("prompt_string"), str):
                    raise RequestError(400, "a prompt object must hold 'prompt_string' (a string)", param="prompt")
                return x["prompt_string"]
            if isinstance(x, list) and any(isinstance(t, str) for t in x):  # strings among token ids: one prompt, tokenized in place
                return mixed(x)
            return x  # type: ignore[return-value]  # a string or ids: generate checks them

        def mixed(x: list) -> list[int]:
            if not all(isinstance(t, str) or (isinstance(t, int) and not isinstance(t, bool)) for t in x):
                raise RequestError(400, "'prompt' mixes token ids with something other than strings", param="prompt")
            f = facts()
            ids: list[int] = []
            for k, piece in enumerate(x):
                ids += f.tokenize(piece, k == 0, True) if isinstance(piece, str) else [piece]  # a leading string gets the specials
            return ids

        if isinstance(p, dict):
            return [one(p)]
        if not isinstance(p, list) or not p:
            return None
        if all(isinstance(t, (int, str)) and not isinstance(t, bool) for t in p) and any(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return [await run_in_threadpool(mixed, p)] if any(isinstance(t, str) for t in p) else None  # one prompt
        if len(p) == 1 and isinstance(p[0], (str, list)) and not (isinstance(p[0], list) and any(isinstance(t, str) for t in p[0])):
            return None  # a batch of one, as generate reads it
        return [await run_in_threadpool(one, x) for x in p]

    async def tokenize(request: Request) -> Response:
        body = await read_json(request)
        content = body.get("content", "")
        if not isinstance(content, str):
            raise RequestError(400, "'content' must be a string", param="content")
        add_special, parse_special = _flag(body, "add_special", False), _flag(body, "parse_special", True)
        f = facts()
        ids = await run_in_threadpool(f.tokenize, content, add_special, parse_special)
        if not _flag(body, "with_pieces", False):
            return JSONResponse({"tokens": ids})
        return JSONResponse({"tokens": [{"id": t, "piece": _utf8_or_bytes(f.piece(t))} for t in ids]})

    async def detokenize(request: Request) -> Response:
        body = await read_json(request)
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < state.n_vocab for t in tokens):
            raise RequestError(400, f"'tokens' must be a list of token ids of this model (0..{state.n_vocab - 1})", param="tokens")
        f = facts()
        text = b"".join(f.piece(t) for t in tokens).decode("utf-8", errors="replace")
        return JSONResponse({"content": text})

    async def apply_template(request: Request) -> Response:
        body = await read_json(request)
        # as a chat completion renders it: its tools, its template variables (llama-server's /apply-template)
        params = parse_gen({k: body[k] for k in APPLY_FIELDS if k in body}, chat=True, n_vocab=state.n_vocab, tool_format=state.tool_format)
        tools = params.tools.template_tools if params.tools else None
        try:
            prompt = await run_in_threadpool(facts().render, params.messages or [], tools, params.template_kwargs, params.continue_final,
                                             params.add_generation_prompt)
        except SettingError as exc:  # no chat template (a base model): what to pass, as run and chat say it
            fix = {"raw": "/completion with plain text", "template_choice": "start serve with --chat-template FILE|NAME"}
            raise RequestError(400, exc.worded(fix)[:500]) from None
        except (InputError, ValueError) as exc:  # a template that refuses these messages
            raise RequestError(400, f"the chat template refused these messages: {exc}"[:500]) from None
        for image in params.images:  # an image's place shown with libmtmd's marker, as llama-server shows its own
            prompt = prompt.replace(image.mark, MARKER)
        return JSONResponse({"prompt": prompt})

    async def props(request: Request) -> Response:
        f = facts()
        return JSONResponse({
            "default_generation_settings": {"params": _settings(state.defaults, state.defaults.max_tokens, ()), "n_ctx": state.n_ctx_seq},
            "total_slots": f.n_parallel,
            "model_alias": state.model_name,
            "model_ftype": f.file_type,
            "model_path": f.path,
            "modalities": {"vision": state.vision, "video": False, "audio": state.audio},
            "endpoint_slots": state.slots_endpoint,
            "endpoint_props": False,
            "endpoint_metrics": state.metrics_endpoint,
            "chat_template": f.chat_template,
            "bos_token": f.bos_token,
            "eos_token": f.eos_token,
            "build_info": FINGERPRINT,
            "is_sleeping": False,  # llama-server's; a sleeping server answers /props from serve/sleep.py
        })

    async def slots(request: Request) -> Response:
        if not state.slots_endpoint:
            return JSONResponse(error_body("This server does not support slots endpoint. Start it with `--slots`", kind="not_supported_error"),
                                status_code=501)
        out = []
        for s in state.scheduler.slots:  # read without the engine's lock: a snapshot, perhaps a step old
            job = s.job
            entry = {"id": s.id, "n_ctx": state.n_ctx_seq, "speculative": False, "is_processing": job is not None,
                     "n_prompt_tokens": len(job.tokens) if job else 0, "n_prompt_tokens_cache": job.n_cached if job else 0}
            if job is not None:
                entry["params"] = _settings(job.sampling, job.max_tokens, job.stop)
                entry["next_token"] = [{"has_next_token": True, "n_remain": job.max_tokens - job.n_gen, "n_decoded": job.n_gen}]
            out.append(entry)
        return JSONResponse(out)

    return [
        Route("/completion", _answers(completion), methods=["POST"]),
        Route("/completions", _answers(completion), methods=["POST"]),  # llama-server's: its own shape, not OpenAI's
        Route("/tokenize", _answers(tokenize), methods=["POST"]),
        Route("/detokenize", _answers(detokenize), methods=["POST"]),
        Route("/apply-template", _answers(apply_template), methods=["POST"]),
        Route("/props", _answers(props), methods=["GET"]),
        Route("/slots", _answers(slots), methods=["GET"]),
    ]


def _settings(s, n_predict: int | None, stop: tuple[str, ...], eog: Callable[[], tuple[int, ...]] | None = None) -> dict:
    """llama-server's ``generation_settings``/``params`` for a ``SamplingConfig``
    (its field names; -1 for no limit, as it writes them). ``logit_bias`` lists
    the request's biases and, with ``ignore_eos``, each end-of-generation token
    at -inf (JSON null), as llama-server adds them (``eog``: the vocabulary's)."""
    bias = [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in s.logit_bias]  # a ban (-inf) is null, as llama-server writes it
    if s.ignore_eos and eog is not None:
        bias += [{"bias": None, "token": t} for t in eog()]
    return {
        "logit_bias": bias,
        "n_predict": n_predict if n_predict else -1,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "seed": -1 if s.seed is None else s.seed,
        "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": 64,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "ignore_eos": s.ignore_eos,
        "stop": list(stop),
        "grammar": s.grammar or "",
        "n_probs": 0,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    }


# llama-server's sampling fields serve does not implement: accepted at their "off" value (clients such as
# llama.cpp's web UI send them all), a 400 naming them otherwise, never silently dropped
OFF = {"typical_p": 1, "mirostat": 0, "dynatemp_range": 0, "xtc_probability": 0, "dry_multiplier": 0, "min_keep": 0,
       "repeat_last_n": 64, "return_tokens": False}
# without effect whatever their value: parameters of samplers that are off, n_keep (serve never shifts a context)
MOOT = frozenset({"dynatemp_exponent", "mirostat_tau", "mirostat_eta", "xtc_threshold", "dry_base", "dry_allowed_length",
                  "dry_penalty_last_n", "dry_sequence_breakers", "penalize_nl", "n_keep", "top_n_sigma"})


def parse_llama(body: dict, *, chat: bool, n_vocab: int, defaults=DEFAULTS, native: bool = False, tool_format: Format = GENERIC,
                max_n: int = 1, n_slots: int | None = None) -> GenParams:
    """A body with llama-server's fields, which it takes on its OpenAI routes too:
    ``n_predict`` (-1: until the model stops; ``max_tokens`` wins where both are
    given), ``logit_bias`` pairs as the object does (``protocol._logit_bias``), its
    samplers at their off value. ``native``: ``/completion``, where a request that
    sets no limit runs until the model stops (or serve's -n), as llama-server's does."""
    for key, off in OFF.items():
        if key in body and body[key] != off:
            raise RequestError(400, f"'{key}' is not supported by this server (only {json.dumps(off)}, its off value)", param=key)
    sigma = body.get("top_n_sigma")
    if sigma is not None and (not isinstance(sigma, (int, float)) or sigma > 0):
        raise RequestError(400, "'top_n_sigma' is not supported by this server (only a value of 0 or less: off)", param="top_n_sigma")
    body = dict(body)
    n_predict = body.pop("n_predict", None)
    n_indent, t_max = (_whole(body.pop(key, None), key) for key in ("n_indent", "t_max_predict_ms"))
    if n_predict is not None and (not isinstance(n_predict, int) or isinstance(n_predict, bool) or n_predict == 0 or n_predict < -1):
        raise RequestError(400, "'n_predict' must be -1 (until the model stops) or a whole number of at least 1", param="n_predict")
    params = parse_gen(body, chat=chat, n_vocab=n_vocab, defaults=defaults, tool_format=tool_format, max_n=max_n, n_slots=n_slots)
    ignored = tuple(k for k in params.ignored if k not in OFF and k not in MOOT)
    limit = params.max_tokens
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        if n_predict is not None:
            limit = None if n_predict == -1 else n_predict
        elif native:
            limit = defaults.max_tokens if defaults.max_tokens > 0 else None
    return dataclasses.replace(params, max_tokens=limit, ignored=ignored, n_indent=n_indent, t_max_predict_ms=t_max)


def _whole(v: object, key: str) -> int:
    """``n_indent``, ``t_max_predict_ms``: a whole number, 0 or less (or none) off, as llama-server reads them."""
    if v is None:
        return 0
    if not isinstance(v, int) or isinstance(v, bool):
        raise RequestError(400, f"'{key}' must be a whole number (0: off)", param=key)
    return max(v, 0)


def parse_completion(body: dict, *, chat: bool, n_vocab: int, defaults=DEFAULTS, tool_format: Format = GENERIC, max_n: int = 1) -> GenParams:
    """``/completion``'s body (see ``parse_llama``); no tools (it is not a chat) and one reply (llama-server's has no ``n``)."""
    return parse_llama(body, chat=False, n_vocab=n_vocab, defaults=defaults, native=True, n_slots=max_n)


class CompletionShaper(Shaper):
    """llama-server's ``/completion`` reply: ``content``, ``stop``, ``tokens_predicted``,
    ``tokens_evaluated``, ``timings``...; streamed as its chunks, with no [DONE]."""

    splits_reasoning = False  # /completion is raw text: llama-server splits nothing there

    def __init__(self, chat: bool, model: str, params: GenParams) -> None:
        super().__init__(chat, model, per_token=params.timings_per_token)
        self.params = params

    def head(self, n: int = 1) -> list[dict | str]:
        return []

    def piece(self, text: str, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        out = {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": job.n_gen, "tokens_evaluated": len(job.tokens)}
        if logprobs is not None:  # n_probs: llama-server's completion_probabilities, per token
            out["completion_probabilities"] = logprobs["content"]
        return [{**out, "timings": job.timings()} if self.per_token else out]

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        """The whole reply (no tools on /completion: it is not a chat)."""
        stop_word = job.stop_word
        stop_type = "limit" if job.finish_reason == "length" else "word" if stop_word else "eos"
        prompt = self.params.prompt
        return {
            "index": 0, "content": text, "tokens": [], "id_slot": job.slot, "stop": True, "model": self.model,
            "tokens_predicted": job.n_gen, "tokens_evaluated": len(job.tokens),
            "generation_settings": _settings(job.sampling, job.max_tokens, self.params.stop, self.eog),
            "prompt": prompt if isinstance(prompt, str) else "", "has_new_line": "\n" in text, "truncated": False,
            "stop_type": stop_type, "stopping_word": stop_word or "", "tokens_cached": len(job.tokens) + job.n_gen,
            "timings": job.timings(),
            **({"completion_probabilities": logprobs["content"]} if logprobs is not None else {}),
        }

    def tail(self, job: Finished, include_usage: bool, *, index: int = 0, logprobs: dict | None = None, usage: dict | None = None) -> list[dict | str]:
        return [self.full("", job, logprobs=logprobs)]

    def failure(self, message: str) -> list[dict | str]:
        return [error_body(message, kind="server_error")]

    def progress(self, report: dict) -> list[dict | str]:
        return [{"content": "", "tokens": [], "stop": False, "prompt_progress": report}]


def verbose_fields(model: str, params: GenParams, job: Finished, text: str, prompt: str) -> dict:
    """llama-server's ``__verbose`` (a request's ``verbose``, or its ``--verbose``):
    the reply as ``/completion`` writes it, with the prompt as the model read it
    (the chat template applied, special tokens written out)."""
    return {**CompletionShaper(False, model, params).full(text, job), "prompt": prompt}


LLAMA_COMPLETION = Dialect(parse_completion, CompletionShaper)
OPENAI_WITH_LLAMA_FIELDS = Dialect(parse_llama, OPENAI.shaper)  # the OpenAI routes, as llama-server's take its fields
