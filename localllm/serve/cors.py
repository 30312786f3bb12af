"""CORS for browser front ends: ``serve --cors ORIGIN`` (repeatable, ``*`` for
any). It wraps the whole app, outside the API-key check, because a browser's
preflight (``OPTIONS`` with ``Access-Control-Request-Method``) never carries
the key: it is answered here, and an allowed origin is reflected on every
answer, a 401 included, so the page can read why it was refused. Without
``--cors`` no CORS header is sent at all (the browser's same-origin rule holds).
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

METHODS = ("GET", "POST", "OPTIONS")
HEADERS = ("Authorization", "Content-Type")  # what an OpenAI or Ollama client in a page sends


def with_cors(app, origins: tuple[str, ...]):
    """``app`` behind Starlette's CORS middleware for ``origins``; ``app`` itself without any."""
    if not origins:
        return app
    return CORSMiddleware(app, allow_origins=list(origins), allow_methods=list(METHODS), allow_headers=list(HEADERS),
                          expose_headers=["X-Ignored-Fields"], max_age=600)
