"""The Starlette application: OpenAI routes, bearer auth, body limits, errors as JSON.

Every answer to a bad request is OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``), never a traceback: an
unexpected exception is logged as one line and answered 500 "internal error".
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from localllm.engine_api import SamplingConfig
from localllm.errors import EngineError, InputError
from localllm.reasoning import Markers, Splitter
from localllm.serve import (
    anthropic,
    audio_routes,
    cors_proxy,
    embeddings,
    gcp,
    handoff,
    infill,
    llama_routes,
    lora_routes,
    mcp_routes,
    ollama,
    ollama_embed,
    prompt_count,
    rerank,
    responses,
    slot_files,
)
from localllm.serve.body import read_body as _read_body
from localllm.serve.choices import Choices
from localllm.serve.compaction import Compactor
from localllm.serve.embeddings import Embeddings
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.protocol import DEFAULTS, OPENAI, Dialect, RequestError, Shaper, error_body, parse_json, resolve_bias
from localllm.serve.rerank import Rerank
from localllm.serve.scheduler import Job, Refused, Scheduler
from localllm.serve.tools import GENERIC, Format, ReplySplitter, thinking_first

MAX_BODY = 1024 * 1024
# answered without the API key: a health check, and Ollama's "is it running" (its clients probe GET or HEAD /)
PUBLIC = ("/health", "/v1/health", "/")
OLLAMA_RUNNING = "Ollama is running"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/embeddings", "/v1/models", "/health", "/metrics",
             "/completion", "/chat/completions", "/completions", "/models", "/v1/health", "/tokenize", "/detokenize", "/apply-template", "/props", "/slots",
             "/infill", "/api/chat", "/api/generate", "/api/tags", "/api/ps", "/api/show", "/api/version", "/",
             *ollama_embed.PATHS, *anthropic.PATHS, *responses.PATHS, *rerank.PATHS, *lora_routes.PATHS, *mcp_routes.PATHS)


@dataclass
class ServeState:
    scheduler: Scheduler
    metrics: ServerMetrics
    model_name: str
    n_ctx_seq: int
    n_vocab: int
    # text -> tokens, run in a worker thread: (params) -> token ids
    tokenize: Callable[[object], list[int]]
    # raises InputError unless llama.cpp parses a GBNF grammar (the model's vocabulary needed): run in a worker thread
    check_grammar: Callable[[str], None] | None = None
    api_key: str | None = None
    max_body: int = MAX_BODY
    json_log: bool = False  # one JSON object per request line instead of text
    defaults: SamplingConfig = DEFAULTS  # what a request's omitted fields take: serve's --temp, --seed, -n
    facts: llama_routes.ModelFacts | None = None  # what /props, /tokenize, /apply-template and Ollama's API read
    metrics_endpoint: bool = True  # serve --metrics (llama-server answers 501 without it)
    slots_endpoint: bool = False  # serve --slots
    tool_format: Format = GENERIC  # how the chat template writes tool calls (serve/tools.py)
    embeddings: Embeddings | None = None  # /v1/embeddings (serve always sets it)
    rerank: Rerank | None = None  # /v1/rerank and its aliases (serve --rerank)
    no_embeddings: str | None = None  # why the embedding routes answer 400 (--pooling none), where embeddings is None
    no_generation: str | None = None  # why this model cannot generate (an encoder: no logits): the generation routes' 400
    reasoning: Markers | None = None  # the thinking markers the chat template writes (localllm.reasoning)
    reasoning_format: str = "deepseek"  # --reasoning-format: deepseek (thinking apart), deepseek-legacy (also left in the text), none
    prompt_tail: Callable[[list[int]], str] | None = None  # the text of a prompt's last tokens: did the template open the thinking?
    mcp: object | None = None  # --mcp-servers-config: a started localllm.mcp.Hub, for /tools (serve/mcp_routes.py); None: off
    cors_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy forwards a page's requests (serve/cors_proxy.py); else 403
    server_tools: object | None = None  # --tools: llama-server's built-in tools (a localllm.server_tools.Toolbox), for /tools; None: off
    vision: bool = False  # a projector is loaded (--mmproj): requests may hold images (serve/media.py)
    audio: bool = False  # its projector has an audio encoder: requests may hold input_audio parts, /v1/audio/transcriptions answers
    compactor: Compactor | None = None  # --compact-at (serve/compaction.py); None: off
    slot_save_path: Path | None = None  # --slot-save-path: where POST /slots/{id}?action=save|restore writes and reads (serve/slot_files.py)
    verbose: bool = False  # llama-server's --verbose: every OpenAI reply carries "__verbose" unless its request says "verbose": false
    aliases: tuple[str, ...] = ()  # --alias a,b: every name of the model (llama-server's /v1/models "aliases"); model_name is the first
    tags: tuple[str, ...] = ()  # --tags: free labels a client may filter by (llama-server's /v1/models "tags")

    def log(self, method: str, path: str, status: int | str, note: str | None = None, job: Job | None = None) -> None:
        """The one line per request: method, path, status, then tokens, TTFT and ITL p50 when it generated."""
        fields: dict = {"method": method, "path": path[:200], "status": int(status)}
        if job is not None:
            fields.update(prompt_tokens=len(job.tokens), cached_tokens=job.n_cached, generated_tokens=job.n_gen,
                          ttft_ms=job.ttft_ms, itl_p50_ms=job.itl_p50_ms, finish_reason=job.finish_reason)
            if job.media is not None:  # the prompt's images, and the vision encoder's part of the TTFT
                fields.update(images=job.media.images, images_encoded=job.images_encoded,
                              encode_ms=job.encode_ns / 1e6 if job.images_encoded else None)
        if note:
            fields["note"] = note[:300]
        if self.json_log:
            line = json.dumps(fields)
        else:
            line = f"{method} {fields['path']} {status}"
            if job is not None:
                ttft, itl = job.ttft_ms, job.itl_p50_ms
                line += (f" prompt={len(job.tokens)} cached={job.n_cached} gen={job.n_gen} "
                         f"ttft={'n/a' if ttft is None else f'{ttft:.1f}ms'} itl_p50={'n/a' if itl is None else f'{itl:.1f}ms'} "
                         f"finish={job.finish_reason or '-'}")
                if job.media is not None:
                    line += f" images={job.media.images} encoded={job.images_encoded}" + (
                        f" encode={job.encode_ns / 1e6:.1f}ms" if job.images_encoded else "")
            if note:
                line += f" {fields['note']}"
        print(f"localllm: {line}" if not self.json_log else line, file=sys.stderr, flush=True)


def model_list(state: ServeState) -> dict:
    """``/v1/models`` as llama-server answers it (tools/server/server-context.cpp,
    get_res_models): OpenAI's ``data`` list with llama-server's ``aliases``, ``tags``
    and ``meta``, and an Ollama-like ``models`` list whose ``capabilities`` say
    "multimodal" with a projector. ``created`` is when the server started."""
    caps = ["completion", "multimodal"] if state.vision or state.audio else ["completion"]
    f = state.facts
    meta = None if f is None else {"n_vocab": state.n_vocab, "n_ctx": state.n_ctx_seq, "n_ctx_train": f.n_ctx_train, "n_embd": f.n_embd,
                                   "n_params": f.n_params, "size": f.size_bytes, "ftype": f.file_type}
    entry = {"name": state.model_name, "model": state.model_name, "modified_at": "", "size": "", "digest": "", "type": "model",
             "description": "", "tags": list(state.tags) or [""], "capabilities": caps, "parameters": "",
             "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "", "quantization_level": ""}}
    data = {"id": state.model_name, "aliases": list(state.aliases), "tags": list(state.tags), "object": "model",
            "created": int(state.metrics.started), "owned_by": "localllm", "capabilities": caps, **({"meta": meta} if meta else {})}
    return {"models": [entry], "object": "list", "data": [data]}


def _error(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


class Guard:
    """ASGI middleware: bearer-token auth (constant-time) on all but ``PUBLIC``,
    and the request counter by endpoint and status."""

    def __init__(self, app, state: ServeState) -> None:
        self.app, self.state = app, state
        self._key = state.api_key.encode() if state.api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"  # bounded label values
        status_box = [0]

        async def send_wrapper(message) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        internal = scope.get("localllm.internal", False)  # the server's own look at its answers (serve/sleep.py): no client sent it
        try:
            if self._key is not None and path not in PUBLIC and not internal and not self._authorized(scope):
                await unauthorized(path)(scope, receive, send_wrapper)
                self.state.log(scope.get("method", "?"), endpoint, 401)
                return
            await self.app(scope, receive, send_wrapper)
            if not scope.get("localllm.logged"):
                self.state.log(scope.get("method", "?"), endpoint, status_box[0])
        finally:
            if not internal and path != "/metrics":  # a scrape is not a request to count (what it shows would change as it is read)
                self.state.metrics.request_done(endpoint, status_box[0])

    def _authorized(self, scope) -> bool:
        assert self._key is not None  # asked only when a key is set
        return authorized(scope, self._key)


def no_metrics() -> Response:
    """/metrics without --metrics: llama-server's 501."""
    return _error(501, "This server does not support metrics endpoint. Start it with `--metrics`", kind="not_supported_error")


def unauthorized(path: str) -> Response:
    """The 401 of a request without the key, in its API's shape."""
    why = "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"
    resp = (JSONResponse(anthropic.error_body(401, why), status_code=401) if path in anthropic.PATHS
            else _error(401, why, kind="authentication_error", code="invalid_api_key"))
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def authorized(scope, key: bytes) -> bool:
    """``key`` as a bearer token (OpenAI's clients) or in ``x-api-key`` (Anthropic's),
    compared in constant time: serve's check, and the router's."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.strip(), key):
            return True
    return False


def build_app(state: ServeState) -> Guard:
    from starlette.concurrency import run_in_threadpool

    async def generate(request: Request, chat: bool, dialect: Dialect = OPENAI, body: dict | None = None) -> Response:
        """One generation in ``dialect``'s shapes; ``body``: already read by the caller."""
        method, path = request.method, request.url.path
        try:
            if state.no_generation is not None:
                raise RequestError(400, state.no_generation, code="not_supported")
            if body is None:
                body = parse_json(await _read_body(request, state.max_body))
            params = dialect.parse(body, chat=chat, n_vocab=state.n_vocab, defaults=state.defaults, tool_format=state.tool_format,
                                   max_n=len(state.scheduler.slots))
            try:
                tokens = await run_in_threadpool(state.tokenize, params)
            except RequestError:
                raise
            except Exception as exc:  # a chat template that refuses these messages (jinja raises)
                raise RequestError(400, f"the chat template refused these messages: {type(exc).__name__}: {exc}"[:500]) from None
            if not tokens:
                raise RequestError(400, "the prompt is empty")
            if params.logit_bias_text:
                if state.facts is None:
                    raise RequestError(400, "'logit_bias' with text keys needs the model's vocabulary, not available here: give token ids",
                                       param="logit_bias")
                params = await run_in_threadpool(resolve_bias, params, state.facts.tokenize)
            if params.tools is not None and params.grammar is not None and not params.tools.triggers and _thinking_open(state, tokens):
                assert state.reasoning is not None  # _thinking_open: the template has thinking markers
                if not state.reasoning.channels:  # (gpt-oss's prompt never ends inside its analysis channel but to continue it)
                    params = replace(params, grammar=thinking_first(params.grammar, state.reasoning))  # a forced call after the thinking
            compacted = None
            if state.compactor is not None and chat:
                try:
                    compacted = await state.compactor(params, tokens, run_in_threadpool)
                except (InputError, RequestError, EngineError):  # a summary refused or failed: the request as it came
                    compacted = None
                if compacted is not None:
                    tokens, params = compacted.tokens, compacted.params
            if params.grammar is not None and state.check_grammar is not None:
                try:
                    await run_in_threadpool(state.check_grammar, params.grammar)
                except InputError as exc:
                    raise RequestError(400, str(exc), param="grammar") from None
            if len(tokens) >= state.n_ctx_seq:
                raise RequestError(400, f"the prompt is {len(tokens)} tokens but a request's context holds {state.n_ctx_seq}: "
                                   "shorten it, or restart the server with a larger --ctx",
                                   param="messages" if chat else "prompt", code="context_length_exceeded", kind="exceed_context_size_error",
                                   extra={"n_prompt_tokens": len(tokens), "n_ctx": state.n_ctx_seq})  # llama-server's type and fields
        except RequestError as exc:
            request.scope["localllm.logged"] = True
            state.log(method, path, exc.status, exc.message)
            return JSONResponse(dialect.error(exc), status_code=exc.status)
        room = state.n_ctx_seq - len(tokens)
        max_tokens = min(params.max_tokens or room, room)
        sampling = SamplingConfig(temperature=params.temperature, top_p=params.top_p, seed=params.seed, max_tokens=max_tokens,
                                  ignore_eos=params.ignore_eos, grammar=params.grammar, top_k=params.top_k, min_p=params.min_p,
                                  repeat_penalty=params.repeat_penalty, presence_penalty=params.presence_penalty,
                                  frequency_penalty=params.frequency_penalty, logit_bias=params.logit_bias,
                                  grammar_triggers=params.tools.triggers if params.tools else (), reasoning_budget=params.reasoning_budget)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        post = handoff.outbox(loop).post  # one wake-up of the loop per burst of emits (serve/handoff.py)

        def put(event: tuple[int, str, object]) -> None:
            post(queue, event)

        choices = Choices(params, tokens, sampling, max_tokens, put)
        job = choices.jobs[0]
        shaper = dialect.shaper(chat, state.model_name, params)
        shaper.eog = state.facts.eog if state.facts is not None else None
        if chat and shaper.splits_reasoning and state.reasoning is not None and state.reasoning_format != "none":
            choices.think = (state.reasoning, _thinking_open(state, tokens), state.reasoning_format == "deepseek-legacy")
        if not all(state.scheduler.submit(j) for j in choices.jobs):
            _cancel(state, choices)
            request.scope["localllm.logged"] = True
            state.log(method, path, 429, "queue full")
            busy = RequestError(429, "too many requests are waiting: retry later", kind="rate_limit_error", code="queue_full")
            return JSONResponse(dialect.error(busy), status_code=429)

        # fields no API defines: accepted (clients send vendor extras), but never silently
        ignored = {"X-Ignored-Fields": ", ".join(f[:40] for f in params.ignored[:20])} if params.ignored else {}
        if compacted is not None:
            ignored["X-Compacted"] = compacted.header
        note = "; ".join(x for x in (f"ignored fields: {ignored['X-Ignored-Fields']}" if params.ignored else "",
                                     f"compacted: {compacted.header}" if compacted is not None else "") if x) or None

        def log_done(status: str) -> None:
            state.log(method, path, status, note, job=job)

        request.scope["localllm.logged"] = True
        if params.stream:
            return StreamingResponse(_stream(request, choices, queue, shaper, params.include_usage, state, log_done), media_type=shaper.media_type,
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **ignored})
        watch = asyncio.create_task(_watch_disconnect(request, queue))
        done = 0
        try:
            while done < len(choices.jobs):
                index, kind, payload = await queue.get()
                choices.add(index, kind, payload)
                if kind == "gone":
                    _cancel(state, choices)
                    log_done("499")
                    return Response(status_code=499)
                elif kind == "error":
                    _cancel(state, choices)
                    failed = _failure(payload)
                    log_done(str(failed.status))
                    return JSONResponse(dialect.error(failed), status_code=failed.status)
                elif kind == "done":
                    done += 1
        except asyncio.CancelledError:
            _cancel(state, choices)
            raise
        finally:
            watch.cancel()
        log_done("200")
        out = choices.response(shaper)
        if (params.verbose if params.verbose is not None else state.verbose) and state.facts is not None and "choices" in out:
            first = out["choices"][0]
            text = first["message"].get("content") or "" if "message" in first else first.get("text", "")
            prompt = state.facts.prompt_text([t for t in tokens if t >= 0])  # an image's filler ids are no tokens
            out["__verbose"] = llama_routes.verbose_fields(state.model_name, params, job, text, prompt)
        return JSONResponse(out, headers=ignored)

    async def read_json(request: Request) -> dict:
        return parse_json(await _read_body(request, state.max_body))

    async def chat_input_tokens(request: Request) -> Response:
        """llama-server's count of a chat body's prompt, as /v1/chat/completions would read it (template, tools, images)."""
        try:
            body = parse_json(await _read_body(request, state.max_body))
            params = llama_routes.OPENAI_WITH_LLAMA_FIELDS.parse(body, chat=True, n_vocab=state.n_vocab, defaults=state.defaults,
                                                                 tool_format=state.tool_format, max_n=len(state.scheduler.slots))
            n = await prompt_count.count(state, params)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": n})

    async def chat_completions(request: Request) -> Response:
        return await generate(request, True, llama_routes.OPENAI_WITH_LLAMA_FIELDS)

    async def completions(request: Request) -> Response:
        return await generate(request, False, llama_routes.OPENAI_WITH_LLAMA_FIELDS)

    async def embed(request: Request) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        try:
            if state.embeddings is None:
                raise RequestError(400, state.no_embeddings) if state.no_embeddings else RequestError(404, "this server does not serve embeddings")
            body = parse_json(await _read_body(request, state.max_body))
            out, ignored = await embeddings.answer(body, state.embeddings, state.model_name)
        except RequestError as exc:
            state.log(method, path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        except EngineError as exc:
            state.log(method, path, 500, str(exc))
            return _error(500, f"the engine failed: {exc}", kind="server_error")
        header = ", ".join(f[:40] for f in ignored[:20])
        state.log(method, path, 200, f"{len(out['data'])} inputs, {out['usage']['prompt_tokens']} tokens" + (f"; ignored fields: {header}" if header else ""))
        return JSONResponse(out, headers={"X-Ignored-Fields": header} if header else {})

    async def models(request: Request) -> Response:
        return JSONResponse(model_list(state))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def root(request: Request) -> Response:
        """Ollama's own answer, which its clients check before anything else."""
        return PlainTextResponse(OLLAMA_RUNNING)

    async def metrics(request: Request) -> Response:
        if not state.metrics_endpoint:
            return no_metrics()
        resp = PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
        # llama-server's header, in its case (Starlette lowercases the names it is given; h11 keeps raw ones as they are)
        resp.raw_headers.append((b"Process-Start-Time-Unix", str(int(state.metrics.started)).encode()))
        return resp

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # registered for HTTPException only
        msg = {404: "no such endpoint", 405: "method not allowed here"}.get(exc.status_code, str(exc.detail))
        return _error(exc.status_code, f"{msg}: {request.method} {request.url.path}"[:300])

    async def internal_error(request: Request, exc: Exception) -> Response:
        state.log(request.method, request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")
        return _error(500, "internal error", kind="server_error")

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embed, methods=["POST"]),
        Route("/embeddings", embed, methods=["POST"]),  # llama-server's alias
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/metrics", metrics, methods=["GET"]),
        # llama-server's unprefixed aliases
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        *llama_routes.routes(state, generate, read_json),
        *infill.routes(state, generate, read_json),
        *ollama.routes(state, generate, read_json),
        *ollama_embed.routes(state, read_json),
        *anthropic.routes(state, generate, read_json),
        *responses.routes(state, generate, read_json),
        *rerank.routes(state, read_json),
        *lora_routes.routes(state),
        *audio_routes.routes(state, generate, read_json),
        *mcp_routes.routes(state, read_json),
        *slot_files.routes(state),
        *cors_proxy.routes(state.cors_proxy),
        Route("/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    ]
    inner: list[Starlette] = []
    posts = [r.path for r in routes if isinstance(r, Route) and "POST" in (r.methods or ())]
    routes += gcp.routes(posts, lambda: inner[0], read_json, health)  # AIP_MODE=PREDICTION only
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal_error})
    inner.append(app)
    return Guard(app, state)


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """The body is read: the next message is http.disconnect when the client goes."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait((-1, "gone", None))
            return


async def _stream(request: Request, choices: Choices, queue: asyncio.Queue, shaper: Shaper, include_usage: bool, state: ServeState, log_done):
    """The shaper's frames (SSE, or Ollama's NDJSON): its head (OpenAI's role chunk per
    choice), one piece per text (with its choice's index and log-probabilities),
    each choice's finish chunk, and after the last its tail (usage and timings,
    usage if asked, [DONE]). With tools, text that may be a call is held, and the
    calls go out whole before the choice's finish chunk."""
    status = "200"
    finished = False
    done = 0
    jobs = choices.jobs
    tools = choices.params.tools
    splitters = [ReplySplitter(tools) for _ in jobs] if tools else None
    think = choices.think
    thinkers = [Splitter(think[0], started_open=think[1]) for _ in jobs] if think is not None and not think[2] else None

    def answer(i: int, parts: list[tuple[str, str]]):
        """The reply's parts as frames: the thinking as the dialect's thinking, the rest through the tool splitter."""
        for kind, text in parts:
            if kind == "reasoning":
                for obj in shaper.thinking(text, jobs[i], index=i):
                    yield shaper.frame(obj)
                continue
            piece = splitters[i].feed(text) if splitters else text
            if piece:
                for obj in shaper.piece(piece, jobs[i], index=i, logprobs=choices.take_logprobs(i)):
                    yield shaper.frame(obj)

    watch = asyncio.create_task(_watch_disconnect(request, queue))
    try:
        for obj in shaper.head(len(jobs)):
            yield shaper.frame(obj)
        while True:
            i, kind, payload = await queue.get()
            choices.add(i, kind, payload)
            if kind == "text":
                assert isinstance(payload, str)  # the scheduler's text pieces
                for frame in answer(i, thinkers[i].feed(payload) if thinkers else [("content", payload)]):
                    yield frame
            elif kind == "progress":  # return_progress: the prompt's reading, batch by batch
                assert isinstance(payload, dict)
                for obj in shaper.progress(payload):
                    yield shaper.frame(obj)
            elif kind == "gone":
                break
            elif kind == "error":
                failed = _failure(payload)
                status = str(failed.status)
                finished = True
                for obj in shaper.failure(failed.message):
                    yield shaper.frame(obj)
                break
            elif kind == "done":
                job = jobs[i]
                if thinkers:  # a marker held back in case it went on, or thinking cut by max_tokens
                    for frame in answer(i, thinkers[i].finish()):
                        yield frame
                if splitters:
                    rest, calls = splitters[i].finish()
                    if rest:
                        for obj in shaper.piece(rest, job, index=i, logprobs=choices.take_logprobs(i)):
                            yield shaper.frame(obj)
                    if calls:
                        job.finish_reason = "tool_calls" if job.finish_reason == "stop" else job.finish_reason
                        for obj in shaper.calls(calls, job, index=i):
                            yield shaper.frame(obj)
                lp = choices.take_logprobs(i) if choices.pending[i] else None
                done += 1
                if done < len(jobs):
                    for obj in shaper.finish(job, index=i, logprobs=lp):
                        yield shaper.frame(obj)
                    continue
                finished = True
                for obj in shaper.tail(job, include_usage, index=i, logprobs=lp, usage=choices.usage()):
                    yield shaper.frame(obj)
                break
    finally:
        watch.cancel()
        if not finished or status == "500":
            _cancel(state, choices)  # the client went away (or a choice failed): free the sequences at the next step
        if not finished:
            status = "499"
        log_done(status)


def _thinking_open(state: ServeState, tokens: list[int]) -> bool:
    """Whether the prompt ends inside the thinking (the template's generation prompt opened it: DeepSeek R1, QwQ)."""
    if state.reasoning is None or state.prompt_tail is None:
        return False
    return state.prompt_tail(tokens).rstrip().endswith(state.reasoning.open)


def _failure(payload: str) -> RequestError:
    """An ("error", message) from the scheduler: the request's own fault (``Refused``: 400) or the engine's (500)."""
    if isinstance(payload, Refused):
        return RequestError(400, str(payload))
    return RequestError(500, f"the engine failed: {payload}", kind="server_error")


def _cancel(state: ServeState, choices: Choices) -> None:
    for j in choices.jobs:
        state.scheduler.cancel(j)
