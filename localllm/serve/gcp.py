"""Vertex AI's prediction protocol, as llama-server serves it
(tools/server/server-http.cpp, ``register_gcp_compat``): on when the
environment says ``AIP_MODE=PREDICTION``, as Vertex AI's containers are run.

``POST /predict`` (``AIP_PREDICT_ROUTE``) takes ``{"instances": [...]}``, each
instance a body for one of the server's routes named by ``@requestFormat``
(a route's camelCase alias, ``chatCompletions`` for ``/v1/chat/completions``,
or its path), answered side by side as ``{"predictions": [...]}``: each
route's JSON, or an ``error`` object for an instance that failed. Streaming
is turned off per instance. ``AIP_HEALTH_ROUTE`` aliases ``/health``.

Each instance is dispatched through the app itself (the inner ASGI app, past
the API-key check the outer request passed), so it gets exactly the route's
checks and bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve import inprocess
from localllm.serve.protocol import RequestError, error_body

MAX_INSTANCES = 128  # llama-server's bound (server-http.cpp)


def settings(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(predict route, health route or "") when Vertex AI's mode is on, else None."""
    env = os.environ if env is None else env
    if env.get("AIP_MODE", "") != "PREDICTION":
        return None

    def route(name: str, default: str) -> str:
        value = env.get(name) or default
        return value if not value or value.startswith("/") else "/" + value

    return route("AIP_PREDICT_ROUTE", "/predict"), route("AIP_HEALTH_ROUTE", "")


def alias(path: str) -> str:
    """llama-server's camelCase name of a route: ``/v1/chat/completions`` -> ``chatCompletions``."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.lstrip("/")
    out, cap = [], False
    for c in s:
        if c == ":" or c == "{":
            break  # path parameters
        if c in "/-_":
            cap = True
            continue
        out.append(c.upper() if cap else c)
        cap = False
    return "".join(out)


def _error(message: str, kind: str = "invalid_request_error") -> dict:
    return error_body(message, kind=kind)


async def _call(app: Callable, path: str, body: dict, headers: list[tuple[bytes, bytes]]) -> Any:
    """``POST path`` with ``body`` through ``app`` in this process: the route's JSON."""
    answer = await inprocess.call(app, "POST", path, json.dumps(body).encode(), headers)
    if not answer.body:
        return None
    text = answer.body.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text if answer.status < 400 else _error(text[:300], "server_error")


def routes(paths: list[str], app: Callable[[], Callable], read_json: Callable, health: Callable) -> list[Route]:
    """``/predict`` (and the health alias) when ``AIP_MODE=PREDICTION``; ``paths``:
    the POST routes an instance may name; ``app()``: the inner app to dispatch to."""
    chosen = settings()
    if chosen is None:
        return []
    predict_path, health_path = chosen
    by_alias: dict[str, str] = {}
    for p in paths:
        by_alias.setdefault(alias(p), p)  # the first registration wins, as llama-server's map

    async def predict(request: Request) -> Response:
        try:
            body = await read_json(request)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        instances = body.get("instances")
        if not isinstance(instances, list):
            return JSONResponse(_error("request body must include an array field named instances"), status_code=400)
        if len(instances) > MAX_INSTANCES:
            return JSONResponse(_error(f"instances array exceeds maximum size of {MAX_INSTANCES}"), status_code=400)
        headers = list(request.scope.get("headers", []))

        async def one(instance: object) -> Any:
            if not isinstance(instance, dict):
                return _error("each instance must be a JSON object")
            fmt = instance.get("@requestFormat")
            if not isinstance(fmt, str):
                return _error("each instance must include a string @requestFormat")
            path = by_alias.get(fmt) or (fmt if fmt in paths else None)
            if path is None:
                return _error(f"no handler registered for @requestFormat: {fmt[:100]}")
            payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
            if "stream" in payload:
                payload["stream"] = False  # the predict route does not stream
            return await _call(app(), path, payload, headers)

        predictions = await asyncio.gather(*(one(i) for i in instances))
        return JSONResponse({"predictions": predictions})

    out = [Route(predict_path, predict, methods=["POST"])]
    if health_path:
        out.append(Route(health_path, health, methods=["GET"]))
    return out
