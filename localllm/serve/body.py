"""A request's body, read under a byte limit: the one reader of serve's routes
(``app``'s JSON routes and ``lora_routes``, whose limit is smaller)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from localllm.serve.protocol import RequestError


async def read_body(request: Request, limit: int) -> bytes:
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
