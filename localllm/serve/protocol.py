"""The OpenAI request and response shapes: validation of untrusted JSON bodies,
and the objects and chunks we answer with. Pure Python.

Unknown fields are ignored (clients send many optional ones); a known field of
the wrong type or out of range is a 400 naming the field, as OpenAI answers.
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from localllm import __version__
from localllm.engine_api import SamplingConfig
from localllm.errors import InputError
from localllm.serve import media, thinking
from localllm.serve import tools as tool_calls

DEFAULTS = SamplingConfig()  # a field the request omits samples as run, chat and the cockpit do (llama-server does the same)
MAX_STOP = 16
MAX_STOP_CHARS = 128
ROLES = ("system", "developer", "user", "assistant", "tool")
FINGERPRINT = f"localllm-{__version__}"  # OpenAI's and llama-server's system_fingerprint: the build that answered


class RequestError(Exception):
    """An error the client caused: an HTTP status and an OpenAI-style body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None,
                 extra: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.extra = extra or {}  # more fields for the error object, e.g. llama-server's n_prompt_tokens and n_ctx

    def body(self) -> dict:
        body = error_body(self.message, kind=self.kind, param=self.param, code=self.code)
        body["error"].update(self.extra)
        return body


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class GenParams:
    chat: bool
    messages: list[dict] | None  # chat
    prompt: str | list[int] | None  # completions: text, or token ids
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # llama.cpp's and vLLM's extension, for benchmarks
    grammar: str | None = None  # GBNF the reply must match: response_format, or llama-server's grammar / json_schema
    top_k: int = DEFAULTS.top_k  # llama-server's extensions, as it accepts them
    min_p: float = DEFAULTS.min_p
    repeat_penalty: float = DEFAULTS.repeat_penalty
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logit_bias_text: tuple[tuple[str, float], ...] = ()  # llama-server's text keys: each of the text's tokens gets the bias (``resolve_bias``)
    ignored: tuple[str, ...] = ()  # fields no API defines: accepted, named in the log and in X-Ignored-Fields
    timings_per_token: bool = False  # llama-server's: each streamed chunk carries the timings so far
    tools: tool_calls.ToolRequest | None = None  # tools the model may call (serve/tools.py); None: a plain reply
    n: int = 1  # choices, each its own sequence
    logprobs: int | None = None  # alternatives per token (chat top_logprobs, completions' logprobs int); None: no logprobs
    n_probs: int | None = None  # llama-server's n_probs: logprobs.content with token ids; None: off
    post_sampling_probs: bool = False  # llama-server's: those values as probabilities after the samplers
    cache_prompt: bool = True  # llama-server's: False reads the whole prompt again
    add_generation_prompt: bool = True  # the template's assistant turn opened after the messages
    continue_final: bool = False  # the last (assistant) message is continued, not closed: its text is the reply's start (prefill)
    id_slot: int = -1  # llama-server's: the slot (sequence) to run in, waiting for it if busy; -1: any
    return_progress: bool = False  # llama-server's: a streamed reply reports its prompt's reading (prompt_progress) batch by batch
    n_indent: int = 0  # llama-server's (its editors' /infill): a later line indented less ends the reply; 0: off
    t_max_predict_ms: int = 0  # llama-server's: past this many ms of generating, a new line ends the reply; 0: off
    lora: dict[int, float] | None = None  # llama-server's per-request adapter scales by id (the others 0); None: the server's
    template_kwargs: dict | None = None  # chat_template_kwargs, reasoning_effort (serve/thinking.py), over serve's; None: serve's
    reasoning_budget: int = -1  # tokens of thinking before its end is forced (serve/thinking.py budget); -1: unlimited
    images: tuple[media.ImagePart, ...] = ()  # image parts, each marked in its message's text (serve/media.py)
    verbose: bool | None = None  # llama-server's: the reply carries "__verbose", its /completion fields with the prompt; None: the server's


def _bad(field: str, what: str) -> RequestError:
    return RequestError(400, f"'{field}' {what}", param=field)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_LORA_SCALE = 100.0  # far past any useful scale; keeps a request from pushing the logits to inf
MAX_LORA_ENTRIES = 1024


def parse_lora(value: object, field: str = "lora") -> dict[int, float]:
    """llama-server's ``[{"id": N, "scale": S}, ...]`` (its ``lora`` field and the
    body of POST /lora-adapters; server-common.cpp parse_lora_request: a later
    entry for the same id wins). Adapters are loaded at start (serve --lora), so
    an entry names one by id, never by path. Whether the ids exist is the
    scheduler's check (it knows the adapters)."""
    if not isinstance(value, list) or len(value) > MAX_LORA_ENTRIES:
        raise _bad(field, f"must be a list of at most {MAX_LORA_ENTRIES} objects with 'id' and 'scale'")
    out: dict[int, float] = {}
    for i, e in enumerate(value):
        if not isinstance(e, dict):
            raise _bad(f"{field}[{i}]", "must be an object with 'id' and 'scale'")
        if "path" in e:
            raise _bad(f"{field}[{i}].path", "is not accepted: adapters are loaded at start (serve --lora FNAME) and picked by id")
        aid, scale = e.get("id"), e.get("scale", 0.0)
        if not isinstance(aid, int) or isinstance(aid, bool) or aid < 0:
            raise _bad(f"{field}[{i}].id", "must be a whole number of at least 0 (GET /lora-adapters lists the ids)")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or abs(scale) > MAX_LORA_SCALE:
            raise _bad(f"{field}[{i}].scale", f"must be a number between {-MAX_LORA_SCALE:g} and {MAX_LORA_SCALE:g}")
        out[aid] = float(scale)
    return out


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise _bad(key, "must be a number")
    if not lo <= v <= hi:
        raise _bad(key, f"must be between {lo:g} and {hi:g}, got {v}")
    return float(v)


def loads(raw: bytes) -> object:
    """A body's JSON; a 400 that says why not: not JSON, or valid JSON nested deeper
    than the parser reads (Python's json recurses per level, up to its recursion
    limit: the bound is named, not called invalid)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError(400, f"the body's JSON is nested deeper than {sys.getrecursionlimit()} levels, more than this server reads") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "the body is not valid JSON") from None


def parse_json(raw: bytes) -> dict:
    body = loads(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    where = lone_surrogate(body)
    if where is not None:
        raise RequestError(400, f"'{where}' holds a lone surrogate (a \\ud800-\\udfff escape with no pair): not text", param=where)
    return body


def lone_surrogate(value: object) -> str | None:
    """The path (``messages[0].content``) of the first string in ``value`` that
    holds a lone UTF-16 surrogate, or None. JSON lets ``"\\udcff"`` through, and
    such a str cannot become UTF-8: it reached the tokenizer, the template or
    llama.cpp's grammar and came back as a 500. Walked without recursion (the
    body is parsed already, so its depth is bounded by the JSON parser)."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _bad_text(v):
                return path or "body"
        elif isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                if isinstance(k, str) and _bad_text(k):
                    return f"{path}.<key>" if path else "<key>"
                stack.append((f"{path}.{k}" if path else str(k), item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(v))))
    return None


def _bad_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


MAX_IMAGES = 64  # image parts in one request (llama-server sets none; each is decoded and encoded)


def _content(v: object, i: int, role: str, images: list[media.ImagePart], nonce: str) -> str:
    """A message's text; an ``image_url`` part (a data URI) is appended to ``images``
    and leaves its mark at its place in the text, as llama-server's media marker."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        parts = []
        for j, part in enumerate(v):
            if isinstance(part, dict) and part.get("type") == "image_url":
                label = part.get("_where")  # a translated dialect's own name for the part (Ollama's messages[0].images[0])
                where = label[:80] if isinstance(label, str) else f"messages[{i}].content[{j}]"
                if role != "user":
                    raise _bad(where, "is an image: only a user's message takes images")
                if len(images) >= MAX_IMAGES:
                    raise _bad(where, f"is an image past the {MAX_IMAGES} a request may hold")
                url = part.get("image_url")
                try:
                    data = media.data_uri(url.get("url") if isinstance(url, dict) else url, where)
                except media.ImageError as exc:
                    raise RequestError(400, str(exc), param=where) from None
                images.append(media.ImagePart(where, data, media.mark(nonce, len(images))))
                parts.append(images[-1].mark)
                continue
            if isinstance(part, dict) and part.get("type") == "input_audio":  # a sound file (serve/media.py's audio parts)
                label = part.get("_where")
                where = label[:80] if isinstance(label, str) else f"messages[{i}].content[{j}]"
                if role != "user" or len(images) >= MAX_IMAGES:
                    raise _bad(where, "is audio: only a user's message takes audio" if role != "user"
                               else f"is a clip past the {MAX_IMAGES} images and clips a request may hold")
                try:
                    data, fmt = media.audio_data(part.get("input_audio"), where)
                except media.ImageError as exc:
                    raise RequestError(400, str(exc), param=where) from None
                images.append(media.ImagePart(where, data, media.mark(nonce, len(images)), audio=fmt or "auto"))
                parts.append(images[-1].mark)
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content", "may hold only text parts ({\"type\": \"text\", \"text\": ...}), "
                           "image_url parts ({\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}) "
                           "and input_audio parts ({\"type\": \"input_audio\", \"input_audio\": {\"data\": BASE64, \"format\": \"wav\"}})")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content", "must be a string or a list of text and image_url parts")


def parse_gen(body: dict, *, chat: bool, n_vocab: int, defaults: SamplingConfig = DEFAULTS,
              tool_format: tool_calls.Format = tool_calls.GENERIC, max_n: int = 1, n_slots: int | None = None) -> GenParams:
    """The request's fields; one it omits takes ``defaults`` (serve's --temp, --seed, -n ..., else llama.cpp's).
    ``tool_format``: how the model's template writes tool calls (serve/tools.py); ``max_n``: the most choices (``n``), the server's sequences;
    ``n_slots``: the sequences an ``id_slot`` may name, where they differ from ``max_n`` (a route with one choice)."""
    try:
        params = _parse_gen(body, chat=chat, n_vocab=n_vocab, defaults=defaults, tool_format=tool_format, max_n=max_n,
                            n_slots=max_n if n_slots is None else n_slots)
    except (tool_calls.ToolsError, thinking.KwargsError) as exc:
        raise _bad(exc.field, exc.why) from None
    if params.post_sampling_probs and (params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty):
        raise _bad("post_sampling_probs", "cannot go with penalties (the request's or the server's): "
                   "they change each token's probabilities by the reply so far")
    return params


def _parse_gen(body: dict, *, chat: bool, n_vocab: int, defaults: SamplingConfig, tool_format: tool_calls.Format, max_n: int,
               n_slots: int) -> GenParams:
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    images: list[media.ImagePart] = []
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise _bad("messages", "must be a non-empty list")
        messages = []
        nonce = media.new_nonce()
        for i, m in enumerate(raw):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}]", "must be an object")
            role = m.get("role")
            if role not in ROLES:
                raise _bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
            messages.append({"role": "system" if role == "developer" else role, "content": _content(m.get("content"), i, role, images, nonce),
                             **tool_calls.message_extras(m, i)})
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]  # a batch of one
        if isinstance(p, str):
            if not p:
                raise _bad("prompt", "is empty")
            prompt = p
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            if not all(0 <= t < n_vocab for t in p):
                raise _bad("prompt", f"holds token ids outside the vocabulary (0..{n_vocab - 1})")
            prompt = list(p)
        else:
            raise _bad("prompt", "must be a non-empty string or list of token ids (one prompt per request)")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens <= 0):
        raise _bad(key, "must be a whole number of at least 1")
    if max_tokens is None and defaults.max_tokens > 0:
        max_tokens = defaults.max_tokens  # serve -n N
    elif max_tokens is None and not chat:
        max_tokens = 16  # OpenAI's default for completions
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= max_n:
        raise _bad("n", f"must be a whole number from 1 to {max_n} (the server's --parallel sequences)")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", "must be a whole number")
    if seed is None:
        seed = defaults.seed
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(x, str) for x in stop):
        stops = tuple(x for x in stop if x)
    else:
        raise _bad("stop", f"must be a string or a list of at most {MAX_STOP} strings")
    if any(len(x) > MAX_STOP_CHARS for x in stops):
        raise _bad("stop", f"strings may be at most {MAX_STOP_CHARS} characters long")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "must be true or false")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options", "must be an object")
    include_usage = bool(opts and opts.get("include_usage") is True)
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise _bad("top_k", "must be a whole number of at least 0 (0: all tokens)")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "must be a string")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos", "must be true or false")
    per_token = body.get("timings_per_token", False)
    if not isinstance(per_token, bool):
        raise _bad("timings_per_token", "must be true or false")
    refused = _refused(body, chat)
    if refused is not None:
        raise _bad(*refused)
    tools = tool_calls.parse_request(body, tool_format) if chat else None
    add_generation_prompt, continue_final = _continuation(body, messages) if messages is not None else (True, False)
    if continue_final and messages:
        messages[-1] = _continued_text(body["messages"][-1], messages[-1])
    if messages is not None:
        messages = tool_calls.for_template(messages, tool_format, tools)
    grammar = _grammar(body)
    if tools is not None and grammar is not None:
        raise _bad(next(k for k in ("response_format", "grammar", "json_schema") if body.get(k) is not None),
                   "cannot go with 'tools': a reply is held either to calls or to this")
    cache_prompt = body.get("cache_prompt", True)
    if not isinstance(cache_prompt, bool):
        raise _bad("cache_prompt", "must be true or false")
    id_slot = body.get("id_slot", -1)
    if not isinstance(id_slot, int) or isinstance(id_slot, bool) or not -1 <= id_slot < n_slots:
        raise _bad("id_slot", f"must be a slot of this server, 0..{n_slots - 1} (or -1: any)")
    return_progress = body.get("return_progress", False)
    if not isinstance(return_progress, bool):
        raise _bad("return_progress", "must be true or false")
    lora = parse_lora(body["lora"]) if body.get("lora") is not None else None
    bias = _logit_bias(body, n_vocab)
    verbose = body.get("verbose")
    if verbose is not None and not isinstance(verbose, bool):
        raise _bad("verbose", "must be true or false")
    return GenParams(
        images=tuple(images),
        verbose=verbose,
        template_kwargs=thinking.from_request(body) if chat else None,
        reasoning_budget=thinking.budget(body, defaults.reasoning_budget) if chat else -1,  # llama-server's: chat routes only
        lora=lora or None,  # an empty list: the server's scales, as llama-server's
        tools=tools,
        n=n,
        logprobs=_logprobs(body, chat),
        n_probs=_count(body, "n_probs", 100) or None,  # 0 is llama-server's default: off
        cache_prompt=cache_prompt,
        return_progress=return_progress,
        post_sampling_probs=_post_sampling(body, grammar is not None or tools is not None),
        add_generation_prompt=add_generation_prompt,
        continue_final=continue_final,
        id_slot=id_slot,
        logit_bias=bias[0],
        logit_bias_text=bias[1],
        ignored=tuple(sorted(k for k in body if k not in (CHAT_FIELDS if chat else COMPLETION_FIELDS) | NO_EFFECT)),
        grammar=tools.grammar if tools is not None else grammar,
        top_k=defaults.top_k if top_k is None else top_k,
        min_p=_number(body, "min_p", defaults.min_p, 0.0, 1.0),
        repeat_penalty=_number(body, "repeat_penalty", defaults.repeat_penalty, 0.01, 10.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        ignore_eos=ignore_eos,
        timings_per_token=per_token,
        chat=chat,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0),
        seed=seed,
        stop=stops,
        stream=stream,
        include_usage=include_usage,
    )


# Every field the APIs define, by what the server does with it (docs/api/openai.md's table says the same, row by row).
HONOURED = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "presence_penalty",
    "frequency_penalty", "logit_bias", "response_format",  # OpenAI
    "top_k", "min_p", "repeat_penalty", "grammar", "json_schema", "ignore_eos", "cache_prompt", "return_progress", "timings_per_token",
    "id_slot", "add_generation_prompt", "continue_final_message",  # llama-server's
    "lora", "verbose",  # llama-server's
    "reasoning_budget_tokens", "thinking_budget_tokens",  # llama-server's per-request thinking budget
})
CHAT_FIELDS = HONOURED | {"messages", "max_completion_tokens", "n", "logprobs", "top_logprobs", "tools", "tool_choice",
                          "parallel_tool_calls", "functions", "function_call", "modalities", "audio", "prediction",
                          "reasoning_effort", "chat_template_kwargs", "web_search_options", "n_probs", "post_sampling_probs"}
COMPLETION_FIELDS = HONOURED | {"prompt", "n", "logprobs", "echo", "suffix", "best_of", "n_probs", "post_sampling_probs"}
NO_EFFECT = frozenset({"user", "metadata", "store", "service_tier"})  # nothing to do for a local server: accepted as they are


def _refused(body: dict, chat: bool) -> tuple[str, str] | None:
    """(field, why) for a defined field asking what this server does not do
    (a 400 naming it, never a silent default); None when all is honoured."""
    checks: list[tuple[str, object, str]] = [
        ("functions", body.get("functions"), "(OpenAI's deprecated form) are not supported: send 'tools'"),
        ("function_call", body.get("function_call") not in (None, "none"), "(OpenAI's deprecated form) is not supported: send 'tool_choice'"),
        ("best_of", body.get("best_of") not in (None, 1), "must be 1"),
        ("echo", body.get("echo") not in (None, False), "is not supported"),
        ("suffix", body.get("suffix") not in (None, ""), "is not supported"),
        ("modalities", body.get("modalities") not in (None, ["text"]), "may only be [\"text\"]"),
        ("audio", body.get("audio") is not None, "is not supported"),
        ("prediction", body.get("prediction") is not None, "is not supported"),
    ]
    for field, bad, why in checks:
        if bad:
            return field, why
    return None


def _count(body: dict, key: str, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v) or not 0 <= v <= hi:
        raise _bad(key, f"must be a whole number from 0 to {hi}")
    return int(v)


def _logprobs(body: dict, chat: bool) -> int | None:
    """Alternatives to report per token, or None: chat's ``logprobs: true`` with
    ``top_logprobs`` (0-20, OpenAI's range; it needs ``logprobs``), or the
    completions API's ``logprobs`` count (OpenAI allows 0-5; 0-20 here, as chat)."""
    if not chat:
        if isinstance(body.get("logprobs"), bool):
            raise _bad("logprobs", "must be a whole number from 0 to 20 on /v1/completions")
        return _count(body, "logprobs", 20)
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise _bad("logprobs", "must be true or false")
    top = _count(body, "top_logprobs", 20)
    if top and not on:
        raise _bad("top_logprobs", "needs 'logprobs': true")
    return (top or 0) if on else None


def _post_sampling(body: dict, constrained: bool) -> bool:
    """llama-server's ``post_sampling_probs``: checked, and refused where the samplers
    change the row by the reply so far (penalties, a grammar), which the engine does
    not replay (``engine.logprobs.post_sampling_probs``)."""
    on = body.get("post_sampling_probs", False)
    if not isinstance(on, bool):
        raise _bad("post_sampling_probs", "must be true or false")
    if on and constrained:
        raise _bad("post_sampling_probs", "cannot go with penalties, a grammar, a response_format or tools: "
                   "those change each token's probabilities by the reply so far")
    return on


def _continuation(body: dict, messages: list[dict]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue the last message) as llama-server decides them
    (server-common.cpp, with its default --prefill-assistant): a last assistant
    message is continued (Anthropic's prefill, vLLM's ``continue_final_message``),
    unless the request says otherwise; both at once is a 400."""
    agp = body.get("add_generation_prompt", True)
    if not isinstance(agp, bool):
        raise _bad("add_generation_prompt", "must be true or false")
    asked = body.get("continue_final_message")
    if asked is not None and not isinstance(asked, bool) and asked != "content":
        raise _bad("continue_final_message", 'must be true, false or "content" (continuing the thinking is not supported)')
    last = messages[-1] if messages else {}
    cont = asked is True or asked == "content"
    if asked is None and last.get("role") == "assistant":
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise _bad("messages", "cannot end with two assistant messages: the last one is continued, so merge them")
        cont, agp = True, False
    if cont and agp:
        raise _bad("continue_final_message", "cannot be true with add_generation_prompt true: set add_generation_prompt to false")
    if cont and last.get("role") != "assistant":
        raise _bad("continue_final_message", "needs the last message to be the assistant's: its text is what is continued")
    if cont and last.get("tool_calls"):
        raise _bad("continue_final_message", "cannot continue an assistant message that holds tool calls")
    return agp, cont


def _continued_text(raw: dict, message: dict) -> dict:
    """The continued message's text parts joined by a blank line, as llama.cpp renders
    the message it continues (common/chat.cpp, ``render_content``'s delimiter)."""
    parts = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return message
    return {**message, "content": "\n\n".join(p["text"] for p in parts)}


MAX_BIAS_ENTRIES = 1024
MAX_BIAS_TEXT = 256  # characters of one text key


def _logit_bias(body: dict, n_vocab: int) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[str, float], ...]]:
    """``logit_bias`` as OpenAI and llama-server take it (server-schema.cpp):
    an object {"token id" or "text": bias} or a list of [token id or text, bias]
    pairs; a bias from -100 to 100, or false to ban (-inf). A text stands for
    each of its tokens (tokenized later, ``resolve_bias``). Returns (ids, texts)."""
    lb = body.get("logit_bias")
    if lb is None:
        return (), ()
    if isinstance(lb, dict):
        pairs = list(lb.items())
    elif isinstance(lb, list) and all(isinstance(p, list) and len(p) == 2 for p in lb):
        pairs = [(p[0], p[1]) for p in lb]
    else:
        raise _bad("logit_bias", 'must be an object {"token id or text": bias} or a list of [token id or text, bias] pairs')
    if len(pairs) > MAX_BIAS_ENTRIES:
        raise _bad("logit_bias", f"has {len(pairs)} entries: at most {MAX_BIAS_ENTRIES}")
    ids: list[tuple[int, float]] = []
    texts: list[tuple[str, float]] = []
    for k, v in pairs:
        if v is False:
            bias = -math.inf
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and -100 <= v <= 100:
            bias = float(v)
        else:
            raise _bad("logit_bias", f"biases must be numbers from -100 to 100 (or false to ban), got {str(v)[:20]!r} for {str(k)[:20]!r}")
        if isinstance(k, int) and not isinstance(k, bool) or isinstance(k, str) and k.isdigit() and len(k) < 10:
            if not 0 <= int(k) < n_vocab:
                raise _bad("logit_bias", f"has a token id outside the vocabulary (0..{n_vocab - 1}): {k}")
            ids.append((int(k), bias))
        elif isinstance(k, str) and k and len(k) <= MAX_BIAS_TEXT and not _bad_text(k):
            texts.append((k, bias))
        else:
            raise _bad("logit_bias", f"keys are token ids or texts of 1 to {MAX_BIAS_TEXT} characters, got {str(k)[:20]!r}")
    return tuple(ids), tuple(texts)


def resolve_bias(params: GenParams, tokenize: Callable[[str, bool, bool], list[int]]) -> GenParams:
    """``params`` with its text ``logit_bias`` keys as token ids: each token of the
    text (tokenized without BOS or special tokens, as llama-server's common_tokenize(vocab, text, false))."""
    if not params.logit_bias_text:
        return params
    extra = [(t, bias) for text, bias in params.logit_bias_text for t in tokenize(text, False, False)]
    return replace(params, logit_bias=params.logit_bias + tuple(extra), logit_bias_text=())


def _grammar(body: dict) -> str | None:
    """The GBNF a request constrains its reply with: OpenAI's ``response_format``
    (``text``; ``json_object``, with llama-server's ``schema`` or not; ``json_schema`` with its ``schema``, ``strict``
    or not: the grammar always holds the reply to it), or llama-server's
    ``grammar`` (GBNF text) and ``json_schema`` (a schema). One of them at most."""
    from localllm.engine import grammar  # lazy: loads llama.cpp's grammar converter, asked only when a request constrains its reply

    given = [k for k in ("response_format", "grammar", "json_schema") if body.get(k) is not None]
    if len(given) > 1:
        raise _bad(given[1], f"cannot go with '{given[0]}': give one way to constrain the reply")
    try:
        if body.get("grammar") is not None:
            g = body["grammar"]
            if not isinstance(g, str) or not g.strip():
                raise _bad("grammar", "must be a non-empty GBNF string")
            return g
        if body.get("json_schema") is not None:
            if not isinstance(body["json_schema"], dict):
                raise _bad("json_schema", "must be a JSON schema object")
            return grammar.from_json_schema(body["json_schema"])
        rf = body.get("response_format")
        if rf is None:
            return None
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            schema = rf.get("schema")  # llama-server's: a json_object with a schema is held to the schema
            if schema is None:
                return grammar.json_object()
            if not isinstance(schema, dict):
                raise _bad("response_format.schema", "must be a JSON schema object")
            return grammar.from_json_schema(schema)
        if kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise _bad("response_format.json_schema", "must be an object with a 'schema' object")
            return grammar.from_json_schema(js.get("schema") or {"type": "object"})
        raise _bad("response_format.type", "must be one of text, json_object, json_schema")
    except InputError as exc:  # the converter refused the schema
        raise RequestError(400, str(exc), param="response_format" if body.get("response_format") is not None else "json_schema") from None


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


class Shaper:
    """Builds the response objects of one request, in OpenAI's shapes with
    llama-server's additions (``system_fingerprint``, ``timings``). Other
    dialects (llama-server's /completion, Ollama's API) subclass it: the
    routes stream whatever ``head``, ``piece``, ``tail`` and ``failure`` give,
    each framed by ``frame``."""

    media_type = "text/event-stream"
    eog: Callable[[], tuple[int, ...]] | None = None  # the vocabulary's end-of-generation tokens (set by the route: llama-server's logit_bias)
    splits_reasoning = True  # a reasoning model's thinking goes to ``thinking`` and ``reasoning`` (False: it stays in the text)

    def __init__(self, chat: bool, model: str, *, per_token: bool = False) -> None:
        self.chat, self.model, self.per_token = chat, model, per_token
        self.id = new_id(chat)
        self.created = int(time.time())
        self._head: str | None = None  # _plain_piece's fixed part
        self.reasoning: dict[int, str] = {}  # each choice's thinking, for ``full`` (set by ``Choices.response``)

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": FINGERPRINT}

    def frame(self, obj: dict | str) -> bytes:
        return sse(obj)

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        """The whole reply of one choice (``index``), with its log-probabilities when asked."""
        finish, usage, timings = job.finish_reason, job.usage(), job.timings()
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if calls:  # OpenAI's shape: content null when the reply is only calls
                message = {"role": "assistant", "content": text.strip() or None, "tool_calls": calls}
            if self.reasoning.get(index):  # llama-server's field (--reasoning-format deepseek)
                message["reasoning_content"] = self.reasoning[index]
            choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage, "timings": timings}
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage, "timings": timings}

    def chunk(self, text: str | None, finish: str | None = None, *, first: bool = False, index: int = 0, logprobs: dict | None = None) -> dict:
        if self.chat:
            # the first chunk names the role with content null, as llama-server and OpenAI send it
            delta: dict = {"role": "assistant", "content": text} if first else {} if text is None else {"content": text}
            return {**self._base("chat.completion.chunk"), "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        return {**self._base("text_completion"), "choices": [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]}

    def head(self, n: int = 1) -> list[dict | str]:
        """What a stream opens with: OpenAI's role chunk, one per choice."""
        return [self.chunk(None, first=True, index=i) for i in range(n)] if self.chat else []

    def piece(self, text: str, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        if logprobs is None and not self.per_token:
            return [self._plain_piece(text, index)]
        out = self.chunk(text, index=index, logprobs=logprobs)
        return [{**out, "timings": job.timings()} if self.per_token else out]

    def thinking(self, text: str, job: Finished, *, index: int = 0) -> list[dict | str]:
        """A streamed piece of the thinking: llama-server's ``reasoning_content`` delta."""
        return [{**self._base("chat.completion.chunk"),
                 "choices": [{"index": index, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}]}]

    def _plain_piece(self, text: str, index: int) -> str:
        """``chunk(text, index=index)`` as its JSON text (what ``frame`` would write),
        the fields before the choice serialized once per reply: one of these goes
        out for every token streamed, on the event loop that shares the cores
        with llama.cpp's decode threads."""
        if self._head is None:
            base = json.dumps(self._base("chat.completion.chunk" if self.chat else "text_completion"), separators=(",", ":"), ensure_ascii=False)
            self._head = base[:-1] + ',"choices":[{"index":'
        value = json.dumps(text, ensure_ascii=False)
        body = f'"delta":{{"content":{value}}}' if self.chat else f'"text":{value}'
        return f'{self._head}{index},{body},"logprobs":null,"finish_reason":null}}]}}'

    def calls_chunk(self, calls: list[dict], *, index: int = 0) -> dict:
        """The calls as one delta: each with its index, id, type, name and whole arguments."""
        deltas = [{"index": i, **c} for i, c in enumerate(calls)]
        return {**self._base("chat.completion.chunk"), "choices": [{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}]}

    def calls(self, calls: list[dict], job: Finished, *, index: int = 0) -> list[dict | str]:
        """What a stream sends for a reply's calls once it is whole: OpenAI's one
        ``calls_chunk``; other dialects (Anthropic's, the Responses API's) send
        several events per call, and may need the job (its usage) to open the stream."""
        return [self.calls_chunk(calls, index=index)]

    def finish(self, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        """The finish chunk of a choice that is not the last to end (``n`` > 1)."""
        return [self.chunk(None, job.finish_reason, index=index, logprobs=logprobs)]

    def tail(self, job: Finished, include_usage: bool, *, index: int = 0, logprobs: dict | None = None, usage: dict | None = None) -> list[dict | str]:
        """The last choice's finish chunk (with the usage of all choices and the
        timings, as llama-server's last chunk), then OpenAI's usage chunk when asked, then [DONE]."""
        usage = usage or job.usage()
        last = {**self.chunk(None, job.finish_reason, index=index, logprobs=logprobs), "usage": usage, "timings": job.timings()}
        extra = [{**self._base("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                  "usage": usage, "timings": job.timings()}] if include_usage else []
        return [last, *extra, "[DONE]"]

    def failure(self, message: str) -> list[dict | str]:
        return [error_body(message, kind="server_error"), "[DONE]"]

    def progress(self, report: dict) -> list[dict | str]:
        """llama-server's ``prompt_progress`` event (``return_progress``): an empty
        assistant delta carrying it, as its to_json_oaicompat_chat sends it."""
        if not self.chat:
            return [{**self._base("text_completion"), "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}],
                     "prompt_progress": report}]
        return [{**self._base("chat.completion.chunk"), "choices": [{"index": 0, "delta": {"role": "assistant", "content": None},
                                                                      "logprobs": None, "finish_reason": None}],
                 "prompt_progress": report}]


class Finished(Protocol):
    """What a shaper reads of a request (``scheduler.Job``)."""

    finish_reason: str | None
    tokens: list[int]
    n_gen: int
    n_cached: int
    sampling: SamplingConfig
    max_tokens: int
    slot: int
    stop_word: str | None
    submit_ns: int

    def usage(self) -> dict: ...
    def timings(self) -> dict: ...


def _openai_shaper(chat: bool, model: str, params: GenParams) -> Shaper:
    return Shaper(chat, model, per_token=params.timings_per_token)


@dataclass(frozen=True)
class Dialect:
    """One API over the same engine: how a request body is read, how the
    replies are shaped, and what an error looks like."""

    parse: Callable[..., GenParams]  # (body, *, chat, n_vocab, defaults) -> GenParams
    shaper: Callable[[bool, str, GenParams], Shaper]  # (chat, model name, params)
    error: Callable[[RequestError], dict] = RequestError.body


OPENAI = Dialect(parse_gen, _openai_shaper)


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()
