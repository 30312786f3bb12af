"""A request through one of the server's own ASGI apps, in this process: Vertex
AI's ``/predict`` (serve/gcp.py) dispatches each instance to its route, and a
server going to sleep (serve/sleep.py) keeps what its read-only routes answer.
No socket, no client: the route's checks and bounds, and its answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str


async def call(app: Callable, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = (), *,
               internal: bool = False) -> Answer:
    """``method path`` with ``body`` through ``app``; ``headers`` as the client sent them (the
    body's length and type are this call's). ``internal``: the server's own look at itself
    (``localllm.internal`` in the scope, which no client can set): past the API key, not counted."""
    kept = [h for h in headers if h[0] not in (b"content-length", b"content-type", b"transfer-encoding")]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
             "headers": [*kept, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             **({"localllm.internal": True} if internal else {})}
    sent = False
    status, chunks, kind = 500, [], "application/json"

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never goes: the route finishes on its own
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status, kind
        if message["type"] == "http.response.start":
            status = message["status"]
            kind = dict(message.get("headers", [])).get(b"content-type", b"application/json").decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return Answer(status, b"".join(chunks), kind)
