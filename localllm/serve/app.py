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
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from localllm.engine_api import SamplingConfig
from localllm.errors import EngineError, InputError
from localllm.serve import embeddings
from localllm.serve.choices import Choices
from localllm.serve.embeddings import Embeddings
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.protocol import RequestError, Shaper, error_body, parse_gen, parse_json, sse
from localllm.serve.scheduler import Job, Scheduler

MAX_BODY = 1024 * 1024
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")


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
    embeddings: Embeddings | None = None  # /v1/embeddings (serve always sets it)

    def log(self, method: str, path: str, status: int | str, note: str | None = None, job: Job | None = None) -> None:
        """The one line per request: method, path, status, then tokens, TTFT and ITL p50 when it generated."""
        fields: dict = {"method": method, "path": path[:200], "status": int(status)}
        if job is not None:
            fields.update(prompt_tokens=len(job.tokens), cached_tokens=job.n_cached, generated_tokens=job.n_gen,
                          ttft_ms=job.ttft_ms, itl_p50_ms=job.itl_p50_ms, finish_reason=job.finish_reason)
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
            if note:
                line += f" {fields['note']}"
        print(f"localllm: {line}" if not self.json_log else line, file=sys.stderr, flush=True)


def _error(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


class Guard:
    """ASGI middleware: bearer-token auth (constant-time) on all but /health,
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

        try:
            if self._key is not None and path != "/health" and not self._authorized(scope):
                resp = _error(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", kind="authentication_error", code="invalid_api_key")
                resp.headers["WWW-Authenticate"] = "Bearer"
                await resp(scope, receive, send_wrapper)
                self.state.log(scope.get("method", "?"), endpoint, 401)
                return
            await self.app(scope, receive, send_wrapper)
            if not scope.get("localllm.logged"):
                self.state.log(scope.get("method", "?"), endpoint, status_box[0])
        finally:
            self.state.metrics.request_done(endpoint, status_box[0])

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(token.strip(), self._key)
        return False


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(400, "bad Content-Length")
        if int(length) > limit:
            raise RequestError(413, f"the body is over {limit} bytes", code="request_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body is over {limit} bytes", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError(400, "the client went away before sending the whole body") from None
    return b"".join(chunks)


def build_app(state: ServeState) -> Guard:
    from starlette.concurrency import run_in_threadpool

    async def generate(request: Request, chat: bool) -> Response:
        method, path = request.method, request.url.path
        try:
            body = parse_json(await _read_body(request, state.max_body))
            params = parse_gen(body, chat=chat, n_vocab=state.n_vocab, max_n=len(state.scheduler.slots))
            try:
                tokens = await run_in_threadpool(state.tokenize, params)
            except RequestError:
                raise
            except Exception as exc:  # a chat template that refuses these messages (jinja raises)
                raise RequestError(400, f"the chat template refused these messages: {type(exc).__name__}: {exc}"[:500]) from None
            if not tokens:
                raise RequestError(400, "the prompt is empty")
            if params.grammar is not None and state.check_grammar is not None:
                try:
                    await run_in_threadpool(state.check_grammar, params.grammar)
                except InputError as exc:
                    raise RequestError(400, str(exc), param="grammar") from None
            if len(tokens) >= state.n_ctx_seq:
                raise RequestError(400, f"the prompt is {len(tokens)} tokens but a request's context holds {state.n_ctx_seq}: "
                                   "shorten it, or restart the server with a larger --ctx",
                                   param="messages" if chat else "prompt", code="context_length_exceeded")
        except RequestError as exc:
            request.scope["localllm.logged"] = True
            state.log(method, path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        room = state.n_ctx_seq - len(tokens)
        max_tokens = min(params.max_tokens or room, room)
        sampling = SamplingConfig(temperature=params.temperature, top_p=params.top_p, seed=params.seed, max_tokens=max_tokens,
                                  ignore_eos=params.ignore_eos, grammar=params.grammar, top_k=params.top_k, min_p=params.min_p,
                                  repeat_penalty=params.repeat_penalty, presence_penalty=params.presence_penalty,
                                  frequency_penalty=params.frequency_penalty, logit_bias=params.logit_bias)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(event: tuple[int, str, object]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

        choices = Choices(params, tokens, sampling, max_tokens, put)
        job = choices.jobs[0]
        if not all(state.scheduler.submit(j) for j in choices.jobs):
            for j in choices.jobs:
                state.scheduler.cancel(j)
            request.scope["localllm.logged"] = True
            state.log(method, path, 429, "queue full")
            return _error(429, "too many requests are waiting: retry later", kind="rate_limit_error", code="queue_full")
        shaper = Shaper(chat, state.model_name)

        # fields no API defines: accepted (clients send vendor extras), but never silently
        ignored = {"X-Ignored-Fields": ", ".join(f[:40] for f in params.ignored[:20])} if params.ignored else {}
        note = f"ignored fields: {ignored['X-Ignored-Fields']}" if ignored else None

        def log_done(status: str) -> None:
            state.log(method, path, status, note, job=job)

        request.scope["localllm.logged"] = True
        if params.stream:
            return StreamingResponse(_stream(request, choices, queue, shaper, params.include_usage, state, log_done), media_type="text/event-stream",
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
                    log_done("500")
                    return _error(500, f"the engine failed: {payload}", kind="server_error")
                elif kind == "done":
                    done += 1
        except asyncio.CancelledError:
            _cancel(state, choices)
            raise
        finally:
            watch.cancel()
        log_done("200")
        return JSONResponse(choices.response(shaper), headers=ignored)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, True)

    async def completions(request: Request) -> Response:
        return await generate(request, False)

    async def embed(request: Request) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        try:
            if state.embeddings is None:
                raise RequestError(404, "this server does not serve embeddings")
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
        return JSONResponse({"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "localllm"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

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
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal_error})
    return Guard(app, state)


def _cancel(state: ServeState, choices: Choices) -> None:
    for j in choices.jobs:
        state.scheduler.cancel(j)


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """The body is read: the next message is http.disconnect when the client goes."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait((-1, "gone", None))
            return


async def _stream(request: Request, choices: Choices, queue: asyncio.Queue, shaper: Shaper, include_usage: bool, state: ServeState, log_done):
    """SSE: a role chunk per choice, one chunk per piece of text (with its choice's
    index and log-probabilities), each choice's finish chunk, usage if asked, [DONE]."""
    status = "200"
    finished = False
    done = 0
    watch = asyncio.create_task(_watch_disconnect(request, queue))
    try:
        if shaper.chat:
            for i in range(len(choices.jobs)):
                yield sse(shaper.chunk("", first=True, index=i))
        while True:
            i, kind, payload = await queue.get()
            choices.add(i, kind, payload)
            if kind == "text":
                yield sse(shaper.chunk(payload, index=i, logprobs=choices.take_logprobs(i)))
            elif kind == "gone":
                break
            elif kind == "error":
                status = "500"
                finished = True
                yield sse(error_body(f"the engine failed: {payload}", kind="server_error"))
                break
            elif kind == "done":
                yield sse(shaper.chunk(None, choices.jobs[i].finish_reason, index=i,
                                       logprobs=choices.take_logprobs(i) if choices.pending[i] else None))
                done += 1
                if done == len(choices.jobs):
                    finished = True
                    if include_usage:
                        yield sse(shaper.usage_chunk(choices.usage()))
                    break
        if finished:
            yield sse("[DONE]")
    finally:
        watch.cancel()
        if not finished or status == "500":
            _cancel(state, choices)  # the client went away (or a choice failed): free the sequences at the next step
        if not finished:
            status = "499"
        log_done(status)
