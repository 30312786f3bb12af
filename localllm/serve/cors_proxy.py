"""``/cors-proxy``: llama-server's experimental proxy for its web UI's MCP
client (tools/server/server-cors-proxy.h), on with ``serve --ui-mcp-proxy``
only; without it, 403 as llama-server answers.

``GET`` or ``POST /cors-proxy?url=http(s)://host/path`` forwards the request's
body to that URL and streams the answer back with its status and content type.
Only headers the page names explicitly go along: ``x-llama-server-proxy-header-NAME:
value`` becomes ``NAME: value``; the caller's own ``Authorization`` (this
server's key), cookies and proxy credentials never leave. A URL with a password,
or another scheme, is a 400.

It can reach whatever this machine reaches (loopback included, as llama-server's
can): that is why it is off by default and, as every route, behind the API key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localllm.serve.protocol import error_body

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's read and write timeouts
MAX_BODY = 32 * 1024 * 1024  # what a page may send through it
OFF = "this feature is disabled: start serve with --ui-mcp-proxy (llama-server's flag) to proxy the web UI's MCP requests"


def _target(url: str) -> str:
    """The URL to forward to; ``ValueError`` naming what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in target URL: {parts.scheme or 'none'!r} (http or https)")
    if not parts.hostname:
        raise ValueError("invalid target URL: missing host")
    if parts.password is not None or parts.username is not None:
        raise ValueError("authentication in target URL is not supported")
    return url if parts.path else url + "/"


def routes(enabled: bool) -> list[Route]:
    async def proxy(request: Request) -> Response:
        if not enabled:
            return JSONResponse({"error": {"message": OFF, "type": "feature_disabled"}}, status_code=403)
        try:
            url = _target(request.query_params.get("url", ""))
        except ValueError as exc:
            return JSONResponse(error_body(str(exc)), status_code=400)
        headers = {k[len(PREFIX):]: v for k, v in request.headers.items() if k.lower().startswith(PREFIX) and len(k) > len(PREFIX)}
        body = b""
        if request.method == "POST":
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY:
                    return JSONResponse(error_body(f"the body is over {MAX_BODY // 2**20} MiB"), status_code=413)
        import httpx2  # lazy: the HTTP client (~40 ms), only once a page uses the proxy

        client = httpx2.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False)
        try:
            upstream = await client.send(client.build_request(request.method, url, headers=headers, content=body or None), stream=True)
        except httpx2.HTTPError as exc:
            await client.aclose()
            return JSONResponse(error_body(f"the proxied request failed: {type(exc).__name__}: {exc}"[:300], kind="server_error"),
                                status_code=502)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        if upstream.status_code in (204, 304) or request.method == "HEAD":
            await upstream.aclose()
            await client.aclose()
            return Response(status_code=upstream.status_code)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "content-encoding", "cache-control")}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)

    return [Route("/cors-proxy", proxy, methods=["GET", "POST"])]
