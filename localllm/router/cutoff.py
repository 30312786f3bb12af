"""A child that stops mid-answer: the last event the client gets, and why.

A streamed answer whose model process dies (a llama.cpp abort, the OOM killer,
``kill -9``) would otherwise just end: the client's read returns EOF and a cut
answer looks like a whole one. So the router ends such a stream with an error
event in the route's own shape, the shape serve's own routes use when the
engine fails mid-answer (``serve.protocol.Shaper.failure`` and its dialects):

- OpenAI's routes (``/v1/chat/completions``, ``/v1/completions``, llama-server's
  ``/completion``…): ``data: {"error": {...}}`` then ``data: [DONE]``, which the
  ``openai`` client raises as an ``APIError``;
- ``/v1/responses``: ``event: error`` with ``{"type": "error", "code", "message"}``;
- ``/v1/messages``: ``event: error`` with Anthropic's error object;
- Ollama's ``/api/*`` (NDJSON): a last line ``{"error": "..."}``, as Ollama ends
  a stream that failed.

The cause comes from the process itself (its exit: the signal that killed it,
or its exit code and its last error line since this request started), never
from an earlier request's log line.
"""

from __future__ import annotations

import asyncio
import json

from localllm.router.children import Child
from localllm.serve import anthropic
from localllm.serve.protocol import error_body

STREAMED = ("text/event-stream", "application/x-ndjson")
EXIT_WAIT_S = 2.0  # how long a broken connection waits for the process's exit, to name it as the cause


def streamed(content_type: str | None) -> bool:
    """Is an answer of this Content-Type sent as it is made (SSE or NDJSON)?"""
    return (content_type or "").split(";")[0].strip().lower() in STREAMED


async def cause(child: Child, exc: Exception, since: int) -> str:
    """Why ``child``'s connection broke: its process's end when it ended (waited
    for up to ``EXIT_WAIT_S``), else the broken connection itself."""
    try:
        await asyncio.wait_for(child.exited.wait(), EXIT_WAIT_S)
    except TimeoutError:
        return f"the connection to {child.name} broke ({type(exc).__name__})"
    return f"{child.name}'s process ended ({child.ending(since)})"


def frame(path: str, message: str) -> bytes:
    """The last event of a stream on ``path`` that broke off, saying ``message``."""
    if path.startswith("/api/"):
        return (json.dumps({"error": message}, ensure_ascii=False) + "\n").encode()
    if path in anthropic.PATHS:
        return _event(anthropic.error_body(500, message))
    if path.rstrip("/").endswith("/responses"):
        return _event({"type": "error", "code": "server_error", "message": message, "param": None})
    data = json.dumps(error_body(message, kind="server_error", code="model_unavailable"), ensure_ascii=False)
    return f"data: {data}\n\ndata: [DONE]\n\n".encode()


def _event(obj: dict) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()
