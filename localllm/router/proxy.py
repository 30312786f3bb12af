"""The router's HTTP face: its own answers, and every other request proxied to
the child serving the model the request names.

Per request: the API key is checked first (before anything can load), the
body read (bounded as a vision model's serve bounds it, ``serve.media.MEDIA_BODY``), the model taken
from its ``model`` field (``?model=`` on a GET; a request that names none goes
to the only loaded model, else it is a 400), the child acquired from the pool
(loading it if need be) and the request sent to it with ``httpx2``: method,
path, query, body and the client's headers, but with the router's internal key
in place of the client's. The answer comes back as it is made
(``aiter_raw``: server-sent events and NDJSON token by token, nothing
buffered), and a client that goes away closes the connection to the child,
which then cancels the generation as it does for any client.

A request with Ollama's ``keep_alive: 0`` and nothing to generate (no
``messages``, no ``prompt``) unloads the model, without loading it first, and
is answered once its process has ended, as Ollama answers it (``done_reason:
"unload"``). ``GET`` and ``HEAD /`` answer Ollama's ``Ollama is running``.

Errors the router makes itself have the shape of the route's API: OpenAI's
``{"error": {"message", "type", "param", "code"}}``, Ollama's
``{"error": "..."}`` on ``/api/*``, Anthropic's ``{"type": "error", "error": {...}}``
on ``/v1/messages``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable

import httpx2
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from localllm import __version__
from localllm.router import cutoff, durations, listing, llama_admin, manage, metrics
from localllm.router.catalog import BadName, Catalog, Unknown
from localllm.router.children import Child
from localllm.router.pool import DEFAULT, Busy, DoesNotFit, LoadFailed, Pool
from localllm.serve import anthropic
from localllm.serve.app import ENDPOINTS, OLLAMA_RUNNING, PUBLIC, authorized
from localllm.serve.media import MEDIA_BODY as MAX_BODY
from localllm.serve.ollama import created_at
from localllm.serve.protocol import RequestError, error_body, parse_json
from localllm.store.registry import ModelEntry
from localllm.util.fmt import safe

OWN = {"/": "GET", "/v1/models": "GET", "/models": "GET", "/api/tags": "GET", "/api/ps": "GET", "/api/version": "GET", "/health": "GET",
       "/v1/health": "GET", "/metrics": "GET", "/models/load": "POST", "/models/unload": "POST", "/api/pull": "POST", "/api/delete": "DELETE"}
PROXIED = frozenset(ENDPOINTS) - set(OWN)
# llama-server router's management routes (router.llama_admin), by method and path
ADMIN = frozenset({("POST", "/models"), ("DELETE", "/models"), ("POST", "/models/reload"), ("GET", "/models/sse")})
KEEP_ALIVE = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings")  # Ollama's routes that take keep_alive
UNLOADS = {"/api/chat": ("messages", "message"), "/api/generate": ("prompt", "response")}  # with keep_alive 0 and this field empty: unload
# not passed on: the connection's own, the client's key (the child gets the internal one), and what httpx2 sets itself
DROP_REQUEST = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-authorization",
                          b"proxy-connection", b"authorization", b"x-api-key", b"content-length", b"trailer", b"expect"})
DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server", b"trailer", b"upgrade"})
RETRY_AFTER_S = 5


class Refusal(RequestError):
    """A ``RequestError`` with headers for the answer (``Retry-After``)."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str], **kw) -> None:
        super().__init__(status, message, **kw)
        self.headers = headers


class Router:
    """The ASGI app: ``catalog`` (what is served), ``pool`` (what is loaded), ``key``
    (the user's API key, or None), ``internal_key`` (the children's)."""

    def __init__(self, catalog: Catalog, pool: Pool, *, key: str | None, internal_key: str, json_log: bool = False,
                 autoload: bool = True, reload: Callable[[], None] | None = None) -> None:
        self.catalog, self.pool = catalog, pool
        self.key = key.encode() if key else None
        self.internal = f"Bearer {internal_key}".encode()
        self.json_log = json_log
        self.metrics = "--metrics" in getattr(getattr(pool, "spawn", None), "options", ())  # serve --metrics, passed on to each child
        self.requests = 0
        self._client: httpx2.AsyncClient | None = None
        self.manage = manage.Manager(catalog, pool, find=lambda name: self._entry(name, required=True), log=self.log)
        self.admin = llama_admin.Admin(pool, self.manage, autoload=autoload, reload=reload or catalog.invalidate)

    @property
    def client(self) -> httpx2.AsyncClient:
        if self._client is None:  # made on the running loop; no proxy from the environment: the children are on loopback
            self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, read=None), trust_env=False,
                                              limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client

    async def aclose(self) -> None:
        await self.admin.close()
        await self.manage.close()
        if self._client is not None:
            await self._client.aclose()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        self.requests += 1
        method, path = scope["method"], scope["path"]
        resp: Response
        if self.key is not None and path not in PUBLIC and not self._authorized(scope):
            resp = self._error(path, 401, "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')", kind="authentication_error",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            self.log(method, path, 401)
            await resp(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            if (method, path) in ADMIN or (path == "/props" and method == "GET" and "model" not in request.query_params):
                resp = await self._admin(request, method, path)
            elif path in OWN:
                if method != OWN[path] and not (method == "HEAD" and OWN[path] == "GET"):
                    raise RequestError(405, f"method not allowed here: {method} {path}"[:300])
                resp = await self._own(request, path)
            elif path in PROXIED:
                await self._proxy(request, scope, receive, send)
                return
            else:
                raise RequestError(404, f"no such endpoint: {method} {path}"[:300])
        except ClientDisconnect:
            return  # gone before its body came: nobody to answer
        except RequestError as exc:
            self.log(method, path, exc.status, exc.message)
            resp = self._error(path, exc.status, exc.message, kind=exc.kind, code=exc.code, param=exc.param,
                               headers=getattr(exc, "headers", None))
        await resp(scope, receive, send)

    def _authorized(self, scope) -> bool:
        assert self.key is not None
        return authorized(scope, self.key)  # serve's own check (serve.app.authorized)

    # -- the router's own answers -------------------------------------------------

    async def _own(self, request: Request, path: str) -> Response:
        if path == "/":
            return PlainTextResponse(OLLAMA_RUNNING)
        if path in PUBLIC:
            return JSONResponse({"status": "ok"})
        if path in ("/v1/models", "/models"):
            if request.query_params.get("reload") in ("1", "true"):
                self.admin.reload()
            return JSONResponse(await listing.openai_models(self.catalog, self.pool))
        if path == "/api/tags":
            return JSONResponse(await listing.ollama_tags(self.catalog))
        if path == "/api/ps":
            return JSONResponse(await listing.ollama_ps(self.catalog, self.pool))
        if path == "/api/version":
            return JSONResponse({"version": __version__})
        if path == "/metrics":  # every loaded child's, labelled with its model (router.metrics)
            if not self.metrics:
                raise RequestError(501, "This server does not support metrics endpoint. Start it with `--metrics`", kind="not_supported_error")
            loaded = [(c.name, c.url) for c in self.pool.children.values() if c.state == "loaded" and c.url]
            texts = await metrics.collect(self.client, loaded, self.internal)
            return Response(metrics.merge(texts, metrics.router_lines(len(loaded), self.pool.loads)), media_type=metrics.CONTENT_TYPE)
        body = parse_json(await read_body(request))
        if path == "/api/pull":
            return await self.manage.pull(body)
        if path == "/api/delete":
            return await self.manage.delete(body)
        if path == "/models/unload" and self.admin.cancel(body.get("model")):
            self.log(request.method, path, 200, f"cancelled the download of {safe(str(body.get('model')))}")
            return JSONResponse({"success": True})
        entry = await self._entry(body.get("model"), required=True)
        if path == "/models/load":
            await self._guarded(self.pool.load(entry))
            self.log(request.method, path, 200, f"loaded {entry.name}")
        else:
            await self.pool.unload(entry.name)
            self.log(request.method, path, 200, f"unloaded {entry.name}")
        return JSONResponse({"success": True})

    async def _admin(self, request: Request, method: str, path: str) -> Response:
        """llama-server router's management routes (``router.llama_admin``)."""
        if path == "/props":
            return JSONResponse(self.admin.props())
        if path == "/models/sse":
            return self.admin.events.stream()
        if path == "/models/reload":
            self.admin.reload()
            return JSONResponse({"success": True})
        if method == "DELETE":
            return await self.admin.delete(request)
        return await self.admin.download(parse_json(await read_body(request)))

    # -- the proxy ------------------------------------------------------------------

    async def _proxy(self, request: Request, scope, receive, send) -> None:
        path = scope["path"]
        body = await read_body(request)
        fields = parse_json(body) if body.strip() else {}
        name = fields.get("model", request.query_params.get("model"))
        keep_alive: object = DEFAULT
        if path in KEEP_ALIVE and fields.get("keep_alive") is not None:
            try:
                keep_alive = durations.parse(fields["keep_alive"])
            except durations.BadDuration as exc:
                raise RequestError(400, f"'keep_alive': {exc}", param="keep_alive") from None
        entry = await self._entry(name, required=False)
        if keep_alive == 0 and path in UNLOADS and fields.get(UNLOADS[path][0]) in (None, "", []):
            resp = await self._unload(request, entry, fields.get("model"), UNLOADS[path][1])
            await resp(scope, receive, send)
            return
        self.admin.refuse_unloaded(entry.name)
        child = await self._guarded(self.pool.acquire(entry))
        try:
            await self._forward(child, scope, receive, send, body)
        finally:
            self.pool.release(child, keep_alive)

    async def _unload(self, request: Request, entry: ModelEntry, asked: object, key: str) -> Response:
        """Ollama's unload: the model stopped once its requests are done (not loaded for it), then the answer."""
        unloaded = await self.pool.unload(entry.name)
        self.log(request.method, request.url.path, 200, f"unloaded {entry.name}: keep_alive 0" if unloaded else f"{entry.name} was not loaded")
        text: object = {"role": "assistant", "content": ""} if key == "message" else ""
        return JSONResponse({"model": asked if isinstance(asked, str) else listing.ollama_name(entry.name), "created_at": created_at(),
                             key: text, "done_reason": "unload", "done": True})

    async def _guarded(self, coro):
        """``coro``, its pool errors turned into the client's: 507 for a model that
        cannot fit this machine even alone (the plan's reason; waiting would not
        help), 502 for a model that failed to load, 503 with Retry-After when no
        room is left now."""
        try:
            return await coro
        except DoesNotFit as exc:
            raise RequestError(507, str(exc), kind="server_error", code="model_does_not_fit") from None
        except LoadFailed as exc:
            raise RequestError(502, str(exc), kind="server_error", code="model_load_failed") from None
        except Busy as exc:
            raise Refusal(503, str(exc), kind="server_error", code="models_busy", headers={"Retry-After": str(RETRY_AFTER_S)}) from None

    async def _entry(self, name: object, *, required: bool) -> ModelEntry:
        """The served entry ``name`` means; without a name, the one loaded model (or the one served)."""
        try:
            if name is None or name == "":
                if not required:
                    loaded = [c.name for c in self.pool.children.values() if c.state == "loaded"]
                    served = await self.catalog.entries()
                    only = loaded if len(loaded) == 1 else [e.name for e in served] if len(served) == 1 else []
                    if only:
                        return await self.catalog.find(only[0])
                raise RequestError(400, "name a model in the body's 'model' field: this server serves several (GET /v1/models "
                                   "lists them)", param="model")
            return await self.catalog.find(name)
        except BadName as exc:
            raise RequestError(400, str(exc), param="model") from None
        except Unknown as exc:
            also = manage.alias(name)  # an Ollama library name (llama3.2:1b) of a catalog model pulled here: its quant, or the one here
            for other in (also, also.partition(":")[0]) if also is not None else ():
                try:
                    return await self.catalog.find(other)
                except (BadName, Unknown):
                    pass
            raise RequestError(404, str(exc), param="model", code="model_not_found") from None

    async def _forward(self, child: Child, scope, receive, send, body: bytes) -> None:
        """Send the request to ``child`` and its answer back: a streamed one (SSE,
        NDJSON) as it comes, ended by an error event in the route's shape if the
        child stops mid-answer (``router.cutoff``); any other whole, so that a child
        that stops before it is done is a 502 naming the model and the cause."""
        method, path = scope["method"], scope["path"]
        url = f"{child.url}{path}"
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope.get("headers", ()) if k not in DROP_REQUEST] + [(b"authorization", self.internal)]
        since = child.mark()
        try:
            try:
                upstream = await self.client.send(self.client.build_request(method, url, headers=headers, content=body), stream=True)
            except (httpx2.RemoteProtocolError, httpx2.ReadError):
                if child.exited.is_set():
                    raise
                # A kept-alive connection the child had closed (after an error answer, uvicorn closes it) fails
                # before any answer: sent once more on a new one (the whole body is in hand). Seen: 2 in 15
                # requests after a 500 got 502 "did not answer (ReadError)".
                upstream = await self.client.send(self.client.build_request(method, url, headers=headers, content=body), stream=True)
        except httpx2.HTTPError as exc:
            await self._unanswered(child, exc, since, scope, receive, send)
            return
        try:
            start = {"type": "http.response.start", "status": upstream.status_code,
                     "headers": [(k, v) for k, v in upstream.headers.raw if k.lower() not in DROP_RESPONSE]}
            if not cutoff.streamed(upstream.headers.get("content-type")):
                whole = await _whole(upstream, receive)
                if isinstance(whole, Exception):
                    await self._unanswered(child, whole, since, scope, receive, send)
                elif whole is not None:
                    await send(start)
                    await send({"type": "http.response.body", "body": whole, "more_body": False})
                return
            await send(start)

            async def broke(exc: Exception) -> bytes:
                why = await cutoff.cause(child, exc, since)
                self.log(method, path, upstream.status_code, f"{child.name} stopped mid-answer: {why}")
                return cutoff.frame(path, f"{child.name} stopped mid-answer, so this answer is incomplete: {why}")

            await _pump(upstream, receive, send, broke)
        finally:
            await upstream.aclose()

    async def _unanswered(self, child: Child, exc: Exception, since: int, scope, receive, send) -> None:
        """The 502 for a request ``child`` did not answer, naming it and why."""
        message = f"{child.name} did not answer: {await cutoff.cause(child, exc, since)}"
        self.log(scope["method"], scope["path"], 502, message)
        await self._error(scope["path"], 502, message, kind="server_error", code="model_unavailable")(scope, receive, send)

    # -- errors and the log ---------------------------------------------------------

    def _error(self, path: str, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None, headers: dict | None = None) -> JSONResponse:
        body = ({"error": message} if path.startswith("/api/") else anthropic.error_body(status, message) if path in anthropic.PATHS
                else error_body(message, kind=kind, param=param, code=code))
        return JSONResponse(body, status_code=status, headers=headers)

    def log(self, method: str, path: str, status: int, note: str | None = None) -> None:
        """One line for what the router answered itself (the children log the requests they answer)."""
        if self.json_log:
            fields: dict = {"method": method, "path": path[:200], "status": status}
            if note:
                fields["note"] = note[:300]
            print(json.dumps(fields), file=sys.stderr, flush=True)
            return
        print(f"localllm: {safe(method)} {safe(path[:200])} {status}{' ' + safe(note[:300]) if note else ''}", file=sys.stderr, flush=True)


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The body, at most ``MAX_BODY`` bytes (413 past it), as serve reads it. The
    bound is a vision model's (``serve.media.MEDIA_BODY``: its images come as base64):
    the child that serves a text model holds its requests to serve's own 1 MiB.
    ``limit``: another route's bound (``/tools``: ``router.tools.MAX_BODY``)."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise RequestError(413 if length.isdigit() else 400, f"the body is over {limit} bytes" if length.isdigit() else "bad Content-Length")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _whole(upstream: httpx2.Response, receive) -> bytes | Exception | None:
    """``upstream``'s whole body; the error if the child's answer broke off; None
    if the client went first."""
    out: list[bytes | Exception] = []

    async def read() -> None:
        try:
            out.append(b"".join([chunk async for chunk in upstream.aiter_raw()]))  # as it came: passed on with its headers
        except httpx2.HTTPError as exc:
            out.append(exc)

    await manage.until_gone(read(), receive)
    return out[0] if out else None


async def _pump(upstream: httpx2.Response, receive, send, broke: Callable[[Exception], Awaitable[bytes]]) -> None:
    """Copy ``upstream``'s body to ``send`` as it arrives, until it ends or the client
    goes (``http.disconnect``); when the child's answer breaks off, ``broke(exc)``'s
    last event is sent before the end."""
    async def copy() -> None:
        try:
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx2.HTTPError as exc:
            await send({"type": "http.response.body", "body": await broke(exc), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    await manage.until_gone(copy(), receive)
