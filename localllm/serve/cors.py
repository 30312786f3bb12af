"""CORS for browser front ends: ``serve --cors ORIGIN`` (repeatable) or
llama-server's ``--cors-origins A,B``: an origin, ``*`` for any, or
``localhost`` for any page served from this machine (``http(s)://localhost``,
``127.0.0.1`` or ``[::1]``, any port; ``localhost.evil.com`` is not one), as
llama-server reads them (tools/server/server-http.cpp).

It wraps the whole app, outside the API-key check, because a browser's
preflight (``OPTIONS`` with ``Access-Control-Request-Method``) never carries
the key: it is answered here, 200 as llama-server answers it, with the origin
reflected only where allowed (a refused origin gets no ``Allow-Origin``, which
is what makes the browser refuse). An allowed origin is reflected on every
answer, a 401 included, so the page can read why it was refused.

Header names go out in their usual case (``Access-Control-Allow-Origin``), as
llama-server writes them: HTTP says case does not matter, but some clients (and
llama.cpp's own server tests) look them up as written.

Unlike llama-server, without ``--cors`` no CORS header is sent at all, so the
browser's same-origin rule holds: llama-server's default (any origin, with
credentials) lets any web page a user opens drive the model on their machine.
The allowed headers are those the preflight asks for: llama-server's ``*`` does
not cover ``Authorization`` in a browser (the Fetch standard's wildcard
excludes it), so a page sending its key would be refused.
"""

from __future__ import annotations

from urllib.parse import urlsplit

METHODS = b"GET, POST, DELETE, OPTIONS"  # llama-server's --cors-methods default
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_ORIGIN = 512


def origins_of(values: list[str] | None) -> tuple[str, ...]:
    """``--cors`` and ``--cors-origins`` values, comma lists split, in order."""
    return tuple(o.strip() for v in values or () for o in v.split(",") if o.strip())


def is_localhost(origin: str) -> bool:
    """``origin`` is a page of this machine: http(s), host localhost, 127.0.0.1 or [::1], any port."""
    try:
        parts = urlsplit(origin)
        if parts.port == 0:  # reading .port raises on one that is not a number, or past 65535
            return False
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and parts.hostname in LOCAL_HOSTS and not parts.path and not parts.query
            and "@" not in parts.netloc)


def with_cors(app, origins: tuple[str, ...]):
    """``app`` behind the CORS rules for ``origins``; ``app`` itself without any."""
    allowed = origins_of(list(origins))
    return Cors(app, allowed) if allowed else app


class Cors:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app, origins: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in origins
        self.local = "localhost" in origins
        self.exact = frozenset(o.rstrip("/").lower() for o in origins if o not in ("*", "localhost"))

    def allows(self, origin: str) -> bool:
        if not origin or len(origin) > MAX_ORIGIN:
            return False
        return self.any or origin.rstrip("/").lower() in self.exact or (self.local and is_localhost(origin))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        origin = headers.get(b"origin", b"").decode("latin-1")
        allowed = self.allows(origin)
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            out = [(b"Access-Control-Allow-Methods", METHODS), (b"Access-Control-Allow-Credentials", b"true"),
                   (b"Access-Control-Allow-Headers", headers.get(b"access-control-request-headers", b"*")[:1024]),
                   (b"Access-Control-Max-Age", b"600"), (b"Vary", b"Origin"), (b"Content-Length", b"0")]
            if allowed:
                out.append((b"Access-Control-Allow-Origin", origin.encode("latin-1")))
            await send({"type": "http.response.start", "status": 200, "headers": out})
            await send({"type": "http.response.body", "body": b""})
            return
        if not allowed:
            await self.app(scope, receive, send)
            return

        async def reflected(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                                                  (b"Access-Control-Allow-Credentials", b"true"),
                                                  (b"Access-Control-Expose-Headers", b"X-Ignored-Fields"), (b"Vary", b"Origin")]}
            await send(message)

        await self.app(scope, receive, reflected)
