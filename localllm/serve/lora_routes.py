"""llama-server's ``/lora-adapters``: list the LoRA adapters serve loaded, and set their scales.

As tools/server (server-context.cpp ``get_lora_adapters``/``post_lora_adapters``,
server-task.cpp ``server_task_result_get_lora``, README "GET /lora-adapters"):

- ``GET`` answers ``[{"id", "path", "scale", "task_name", "prompt_prefix"}]``;
- ``POST`` takes ``[{"id", "scale"}]`` and sets the server's scales: the ids
  listed at their scales, every other adapter at 0 (``construct_lora_list``),
  answering ``{"success": true}``; a request's own ``lora`` field still wins for
  that request, and requests already running keep the scales they started with.

Adapters come only from ``serve --lora``/``--lora-scaled``: nothing here loads
a file, so no path from a client reaches the disk. Where llama-server ignores
an id no adapter has, this answers 400 naming it (a typo should not look like
success).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.errors import InputError
from localllm.modelfile.lora import read_adapter
from localllm.serve.body import read_body
from localllm.serve.protocol import RequestError, loads, parse_lora

PATHS = ("/lora-adapters",)
MAX_BODY = 64 * 1024  # a list of at most protocol.MAX_LORA_ENTRIES small objects


def routes(state) -> list[Route]:
    """GET and POST ``/lora-adapters`` over ``state`` (``app.ServeState``: its scheduler
    holds the adapters and the server's scales)."""
    meta: dict[str, tuple[str, str]] = {}

    def described(path: str) -> tuple[str, str]:
        """The adapter's task_name and prompt_prefix (its header's adapter.lora.* keys), read once."""
        if path not in meta:
            try:
                info = read_adapter(path)
                meta[path] = (info.task_name, info.prompt_prefix)
            except InputError:  # replaced on disk since the load: nothing to tell
                meta[path] = ("", "")
        return meta[path]

    async def get(request: Request) -> Response:
        sched = state.scheduler
        out = [{"id": i, "path": p, "scale": s, "task_name": described(p)[0], "prompt_prefix": described(p)[1]}
               for i, (p, s) in enumerate(zip(sched.adapters, sched.lora_scales))]
        return JSONResponse(out)

    async def post(request: Request) -> Response:
        request.scope["localllm.logged"] = True
        try:
            body = await _read(request)
            if not isinstance(body, list):
                raise RequestError(400, "Request body must be an array")  # llama-server's words
            scales = parse_lora(body, "body")
            n = len(state.scheduler.adapters)
            bad = sorted(i for i in scales if i >= n)
            if bad:
                have = f"ids 0..{n - 1}" if n else "none (start serve with --lora FNAME)"
                raise RequestError(400, f"no adapter has id {bad[0]}: the server's adapters are {have}", param="id")
        except RequestError as exc:
            state.log(request.method, request.url.path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        state.scheduler.lora_scales = tuple(scales.get(i, 0.0) for i in range(n))  # one assignment: the engine thread reads it whole
        state.log(request.method, request.url.path, 200, "scales " + ", ".join(f"{s:g}" for s in state.scheduler.lora_scales))
        return JSONResponse({"success": True})

    return [Route(PATHS[0], get, methods=["GET"]), Route(PATHS[0], post, methods=["POST"])]


async def _read(request: Request) -> object:
    """The JSON body (a list here, not an object), at most ``MAX_BODY`` bytes."""
    return loads(await read_body(request, MAX_BODY))
