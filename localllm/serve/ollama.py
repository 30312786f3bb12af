"""Ollama's API over the same engine and scheduler: ``/api/chat``,
``/api/generate`` (streamed as NDJSON unless ``"stream": false``),
``/api/tags``, ``/api/ps``, ``/api/show`` and ``/api/version``, so clients that speak only
Ollama's API can connect (``/api/embed`` and ``/api/embeddings``: ``serve.ollama_embed``).

``tools`` on ``/api/chat`` work as on ``/v1/chat/completions``: Ollama's calls
(``arguments`` an object, no id needed) and ``role: "tool"`` results (matched to
their call by ``tool_call_id``, else ``tool_name``) become OpenAI's for
``parse_gen``, and the reply's calls go out in Ollama's shape. The listings'
``digest`` is the model file's sha256 (``store.digest``), which clients tell
models apart by.

A request is translated into the OpenAI body ``protocol.parse_gen`` checks, so
the limits and refusals are the same; ``options`` Ollama defines but this
server does not apply are named in the ``X-Ignored-Fields`` header and the log,
as unknown OpenAI fields are. Errors are Ollama's ``{"error": "..."}``.
Durations are nanoseconds as Ollama gives them; ``load_duration`` is null (the
model was loaded before any request, nothing was measured for this one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm import __version__
from localllm.serve import media
from localllm.serve.protocol import DEFAULTS, Dialect, Finished, GenParams, RequestError, Shaper, parse_gen
from localllm.serve.tools import GENERIC, Format
from localllm.store import digest

# Ollama's options mapped onto the request fields parse_gen knows
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
                 "stop": "stop", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty"}
REFUSED = {"suffix": "is not supported", "template": "cannot be changed per request",
           "context": "(a token context from an earlier reply) is not supported: send the conversation to /api/chat"}
NO_EFFECT = {"model", "keep_alive", "stream", "options", "format", "system", "raw", "messages", "prompt", "think", "tools"}


def created_at() -> str:
    """Now in UTC, RFC 3339 with nanoseconds, as Ollama writes ``created_at``."""
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def tagged(name: str) -> str:
    """The name Ollama lists: ``NAME:latest`` for a name without a tag."""
    return name if ":" in name else f"{name}:latest"


def _bad(field: str, why: str) -> RequestError:
    return RequestError(400, f"'{field}' {why}", param=field)


def _with_images(m: dict, where: str) -> dict:
    """An Ollama message with ``images`` (base64 pictures) as OpenAI's: an ``image_url``
    part each, then the text (images first, one a line, as Ollama places them)."""
    images = m.get("images")
    if images in (None, []):
        return {"role": m.get("role"), "content": m.get("content")}
    if not isinstance(images, list):
        raise _bad(where, "must be a list of pictures as base64 text")
    parts: list[dict] = []
    for k, b64 in enumerate(images):
        try:
            data = media.base64_payload(b64, f"{where}[{k}]")
        except media.ImageError as exc:
            raise RequestError(400, str(exc), param=exc.where) from None
        parts += [{"type": "image_url", "image_url": {"url": "data:image/unknown;base64," + data}, "_where": f"{where}[{k}]"},
                  {"type": "text", "text": "\n"}]
    content = m.get("content")
    if content not in (None, "") and not isinstance(content, str):
        raise _bad(where.replace(".images", ".content").replace("images", "prompt"), "must be a string")
    return {"role": m.get("role"), "content": [*parts, {"type": "text", "text": content or ""}]}


def _call_in(c: object, where: str, default_id: str) -> dict:
    """An Ollama tool call of an earlier turn (``arguments`` an object) as OpenAI's (JSON text, an id)."""
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(c, dict) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(where, 'must be {"function": {"name": ..., "arguments": {...}}}')
    args = fn.get("arguments")
    if isinstance(args, (dict, type(None))):
        args = json.dumps(args or {}, ensure_ascii=False)
    elif not isinstance(args, str):  # a string is OpenAI's form, taken as it is
        raise _bad(f"{where}.function.arguments", "must be an object")
    cid = c.get("id")
    return {"id": cid if isinstance(cid, str) and cid else default_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def _messages(raw: list, where: str) -> list:
    """Ollama's messages as OpenAI's: pictures as image_url parts, an assistant's
    ``tool_calls`` with an id each (``call_I_J`` where Ollama sent none: the same
    every turn, so the prompt's cached prefix holds), and a ``tool`` result's
    ``tool_call_id`` the call it answers: its own, else the earliest unanswered
    call of its ``tool_name``, else the earliest unanswered one."""
    out: list = []
    waiting: list[tuple[str, str]] = []  # (id, name) of the calls not answered yet
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            out.append(m)  # parse_gen names it
            continue
        one = _with_images(m, where.format(i))
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls not in (None, []):
            if not isinstance(calls, list):
                raise _bad(f"messages[{i}].tool_calls", "must be a list")
            one["tool_calls"] = [_call_in(c, f"messages[{i}].tool_calls[{j}]", f"call_{i}_{j}") for j, c in enumerate(calls)]
            waiting = [(c["id"], c["function"]["name"]) for c in one["tool_calls"]]
        elif m.get("role") == "tool":
            name = m.get("tool_name", m.get("name"))
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or not cid:
                found = next((w for w in waiting if w[1] == name), waiting[0] if waiting else None)
                cid = found[0] if found else f"call_{i}"
            waiting = [w for w in waiting if w[0] != cid]
            one["tool_call_id"] = cid
            if isinstance(name, str):
                one["name"] = name
        out.append(one)
    return out


def _calls_out(calls: list[dict]) -> list[dict]:
    """The reply's calls (OpenAI's, ``arguments`` JSON text) in Ollama's shape: ``arguments`` an object."""
    out = []
    for k, c in enumerate(calls):
        fn = c["function"]
        try:
            args: Any = json.loads(fn["arguments"])
        except ValueError:
            args = {}  # not expected: the parser wrote them as JSON
        out.append({"id": c["id"], "function": {"index": k, "name": fn["name"], "arguments": args}})
    return out


def _translate(body: dict, *, chat: bool, n_ctx: int | None, generate: bool = False) -> tuple[dict, list[str], int | None]:
    """(an OpenAI body, the fields and options ignored, num_predict) for an Ollama body."""
    for field, why in REFUSED.items():
        if body.get(field) not in (None, "", []):
            raise _bad(field, why)
    out: dict = {"model": body.get("model"), "stream": True if body.get("stream") is None else body["stream"]}
    think = body.get("think")
    if isinstance(think, bool):  # the template's enable_thinking (serve/thinking.py); true also splits the thinking out
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif think is not None:
        if think not in ("low", "medium", "high"):
            raise _bad("think", "must be true, false, or one of low, medium, high")
        out["reasoning_effort"] = think  # gpt-oss's levels, as Ollama passes them
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise _bad("messages", "must be a list")
        where = "images" if generate else "messages[{}].images"  # /api/generate's images are its prompt's
        out["messages"] = _messages(messages, where)
    tools = body.get("tools")
    if tools not in (None, []):
        if generate:
            raise _bad("tools", "go to /api/chat: /api/generate calls none")
        if not isinstance(tools, list):
            raise _bad("tools", "must be a list of tools")
        out["tools"] = [{"type": "function", **t} if isinstance(t, dict) and "type" not in t else t for t in tools]  # Ollama's type is optional
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt}}
    elif fmt not in (None, ""):
        raise _bad("format", "must be \"json\" or a JSON schema object")
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise _bad("options", "must be an object")
    ignored = [f"options.{k}"[:40] for k in opts if k not in OPTION_FIELDS and k not in ("num_predict", "num_ctx")]
    ignored += [k for k in body if k not in NO_EFFECT and k not in REFUSED and not (generate and k == "images")]
    for k, field in OPTION_FIELDS.items():
        if opts.get(k) is not None:
            out[field] = opts[k]
    num_ctx = opts.get("num_ctx")
    if num_ctx is not None and (not isinstance(num_ctx, int) or isinstance(num_ctx, bool) or num_ctx < 1):
        raise _bad("options.num_ctx", "must be a whole number of at least 1")
    if num_ctx is not None and n_ctx is not None and num_ctx > n_ctx:
        raise _bad("options.num_ctx", f"asks for {num_ctx} tokens, but this server holds {n_ctx} per request: restart it with a larger --ctx")
    num_predict = opts.get("num_predict")
    if num_predict is not None and (not isinstance(num_predict, int) or isinstance(num_predict, bool) or num_predict == 0 or num_predict < -2):
        raise _bad("options.num_predict", "must be -1 (until the model stops), -2 (until the context is full) or at least 1")
    return out, ignored, num_predict


def _parse(body: dict, *, chat: bool, n_vocab: int, defaults=DEFAULTS, generate: bool, n_ctx: int | None = None, tool_format: Format = GENERIC,
           max_n: int = 1) -> GenParams:
    """Ollama's body as the OpenAI one parse_gen checks, with the template's ``tool_format``; ``max_n`` is unused: Ollama has no ``n``."""
    if generate:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _bad("prompt", "must be a string")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            raise _bad("system", "must be a string")
        user = {"role": "user", "content": prompt, "images": body.get("images")}
        body = {**body, "messages": ([{"role": "system", "content": system}] if system else []) + [user]}
        if body.get("raw") not in (None, False, True):
            raise _bad("raw", "must be true or false")
        if body.get("raw") is True and body.get("images") not in (None, []):
            raise _bad("images", "cannot go with raw: true here: leave raw out, and the chat template places them")
    out, ignored, num_predict = _translate(body, chat=True, n_ctx=n_ctx, generate=generate)
    if not chat:  # /api/generate with raw: the prompt as it is, no template
        out["prompt"] = body["prompt"]
        del out["messages"]
    params = parse_gen(out, chat=chat, n_vocab=n_vocab, defaults=defaults, tool_format=tool_format)
    limit = num_predict if num_predict is not None and num_predict > 0 else defaults.max_tokens if defaults.max_tokens > 0 else None
    return dataclasses.replace(params, max_tokens=limit, ignored=tuple(ignored))


class OllamaShaper(Shaper):
    """NDJSON: one object per piece, then the last with ``done: true``, the reason and the counts."""

    media_type = "application/x-ndjson"
    key = "message"
    def __init__(self, chat: bool, model: str, params: GenParams) -> None:
        super().__init__(chat, model)
        # Ollama's think: true or a level puts the thinking in its own field; left out, it stays in the text, as before
        asked = params.template_kwargs or {}
        self.splits_reasoning = asked.get("enable_thinking") is True or "reasoning_effort" in asked

    def frame(self, obj: dict | str) -> bytes:
        return (json.dumps(obj, ensure_ascii=False) + "\n").encode()

    def _text(self, text: str, thinking: str | None = None, calls: list[dict] | None = None) -> object:
        if self.key != "message":
            return text
        return {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {}),
                **({"tool_calls": _calls_out(calls)} if calls else {})}

    def thinking(self, text: str, job: Finished, *, index: int = 0) -> list[dict | str]:
        """A streamed piece of the thinking: Ollama's ``message.thinking`` (``thinking`` beside ``response`` for generate)."""
        if self.key == "message":
            return [{"model": self.model, "created_at": created_at(), "message": {"role": "assistant", "content": "", "thinking": text},
                     "done": False}]
        return [{"model": self.model, "created_at": created_at(), "response": "", "thinking": text, "done": False}]

    def head(self, n: int = 1) -> list[dict | str]:
        return []

    def piece(self, text: str, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        return [{"model": self.model, "created_at": created_at(), self.key: self._text(text), "done": False}]

    def calls(self, calls: list[dict], job: Finished, *, index: int = 0) -> list[dict | str]:
        """A stream's calls, once the reply is whole: one object before the last, as Ollama sends them."""
        return [{"model": self.model, "created_at": created_at(), "message": self._text("", None, calls), "done": False}]

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        """The last object, with the reply's calls when not streamed (logprobs and n are OpenAI's).
        A reply that called ends with Ollama's ``stop``, not OpenAI's ``tool_calls``."""
        t = job.timings()
        thought = self.reasoning.get(index)
        reason = "stop" if job.finish_reason == "tool_calls" else job.finish_reason
        return {
            "model": self.model, "created_at": created_at(), self.key: self._text(text, thought, calls),
            **({"thinking": thought} if thought and self.key == "response" else {}), "done": True, "done_reason": reason,
            "total_duration": time.perf_counter_ns() - job.submit_ns,
            "load_duration": None,
            "prompt_eval_count": len(job.tokens),
            "prompt_eval_duration": None if t["prompt_ms"] is None else int(t["prompt_ms"] * 1e6),
            "eval_count": job.n_gen,
            # Ollama's "time spent generating the response", measured: from the first token to the last (the
            # first one's own time is the prompt's); the mean gap times eval_count overstated it by one gap,
            # past total_duration when the prompt came from the cache (a fresh-machine run: 142 ms against 141)
            "eval_duration": None if t["predicted_ms"] is None else int(t["predicted_ms"] * 1e6),
            **_image_fields(t),
        }

    def tail(self, job: Finished, include_usage: bool, *, index: int = 0, logprobs: dict | None = None, usage: dict | None = None) -> list[dict | str]:
        return [self.full("", job)]

    def failure(self, message: str) -> list[dict | str]:
        return [{"error": message}]

    def progress(self, report: dict) -> list[dict | str]:
        return []  # Ollama's stream has no such line


def _image_fields(t: dict) -> dict:
    """With images in the prompt: how many, how many the vision encoder ran on, and its time
    (ns; null when every one came from the cache). prompt_eval_duration is then the rest."""
    if "images" not in t:
        return {}
    enc = t["encode_ms"]
    return {"image_count": t["images"], "image_encode_count": t["encode_n"], "image_encode_duration": None if enc is None else int(enc * 1e6)}


class GenerateShaper(OllamaShaper):
    key = "response"


def _error(exc: RequestError) -> dict:
    return {"error": exc.message}


def routes(state, generate: Callable[..., Awaitable[Response]], read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The routes, over ``state`` (``app.ServeState``) and the app's ``generate``."""

    def dialect(gen: bool) -> Dialect:
        def parse(body: dict, **kw) -> GenParams:
            return _parse(body, generate=gen, n_ctx=state.n_ctx_seq, **kw)

        def shaper(chat: bool, model: str, params: GenParams) -> Shaper:
            return (GenerateShaper if gen else OllamaShaper)(chat, name(), params)  # the name /api/tags lists

        return Dialect(parse, shaper, _error)

    chat_dialect, generate_dialect = dialect(False), dialect(True)

    def loaded(key: str, body: dict) -> Response:
        """Ollama's answer to a request with nothing to say: the model is loaded."""
        text: object = {"role": "assistant", "content": ""} if key == "message" else ""
        return JSONResponse({"model": name(), "created_at": created_at(), key: text,
                             "done": True, "done_reason": "load"})

    async def api_chat(request: Request) -> Response:
        try:
            body = await read_json(request)
        except RequestError as exc:
            return JSONResponse(_error(exc), status_code=exc.status)
        if body.get("messages") == []:
            return loaded("message", body)
        return await generate(request, True, chat_dialect, body=body)

    async def api_generate(request: Request) -> Response:
        try:
            body = await read_json(request)
        except RequestError as exc:
            return JSONResponse(_error(exc), status_code=exc.status)
        if body.get("prompt") in (None, ""):
            return loaded("response", body)
        return await generate(request, body.get("raw") is not True, generate_dialect, body=body)

    def details() -> dict:
        f = state.facts
        if f is None:
            return {"format": "gguf"}
        return {"parent_model": "", "format": "gguf", "family": f.architecture, "families": [f.architecture],
                "parameter_size": f"{f.n_params / 1e9:.1f}B" if f.n_params >= 1e9 else f"{f.n_params / 1e6:.0f}M",
                "quantization_level": f.file_type}

    def name() -> str:
        return tagged(state.model_name)

    def modified() -> str | None:
        f = state.facts
        return None if f is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.stat(f.path).st_mtime))

    async def sha() -> str | None:
        """The file's sha256: read once (in a thread), then kept (``store.digest``)."""
        return await digest.digest(state.facts.path if state.facts else None)

    def capabilities() -> list[str]:
        """Ollama's: what llm-ollama registers a model for. Tools work on every model that generates (serve/tools.py)."""
        if state.no_generation is not None:
            return ["embedding"]
        return ["completion", "tools", *(["vision"] if state.vision else [])]

    async def tags(request: Request) -> Response:
        f = state.facts
        model = {"name": name(), "model": name(), "modified_at": modified(), "size": f.size_bytes if f else None,
                 "digest": await sha(), "details": details()}
        return JSONResponse({"models": [model]})

    async def ps(request: Request) -> Response:
        """The loaded model: always this one, loaded until serve stops (no expiry); the VRAM share is not measured here."""
        f = state.facts
        return JSONResponse({"models": [{"name": name(), "model": name(), "size": f.size_bytes if f else None, "digest": await sha(),
                                         "details": details(), "expires_at": None, "size_vram": None, "context_length": state.n_ctx_seq,
                                         "localllm": {"context": f.context if f else None}}]})  # the context's why (plan.fitting.context_why)

    async def show(request: Request) -> Response:
        f = state.facts
        info = {} if f is None else {"general.architecture": f.architecture, "general.parameter_count": f.n_params,
                                     f"{f.architecture}.context_length": f.n_ctx_train, f"{f.architecture}.embedding_length": f.n_embd}
        return JSONResponse({"modelfile": "", "parameters": "", "template": f.chat_template if f else "", "details": details(),
                             "model_info": info, "capabilities": capabilities(), "modified_at": modified(), "digest": await sha()})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": __version__})

    return [
        Route("/api/chat", api_chat, methods=["POST"]),
        Route("/api/generate", api_generate, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/version", version, methods=["GET"]),
    ]
