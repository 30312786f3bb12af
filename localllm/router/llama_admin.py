"""llama-server router's own management routes, answered as it answers them
(``tools/server/README.md``, "Using multiple models"; its tests in
``tools/server/tests/unit/test_router.py``):

- ``GET /props`` without ``?model=``: the router's (``role: router``,
  ``max_instances``, ``models_autoload``); with it, the model's (proxied).
- ``GET /models?reload=1`` and ``POST /models/reload``: read the model list
  (``localllm list``) and the presets INI again, at once. A model whose options
  changed is fitted again at its next load; a loaded one keeps its options
  until then.
- ``POST /models`` ``{"model": NAME}``: start a download in the background
  (``{"success": true}``) through the router's ``/api/pull`` job (``manage``:
  resumed, sha256 checked, the Hub untrusted); follow it on ``/models/sse``.
  ``POST /models/unload`` naming a download in progress cancels it, as there.
- ``DELETE /models?model=NAME``: delete it as ``/api/delete`` does
  (``localllm rm``'s rules).
- ``GET /models/sse``: server-sent events, each ``{"model", "event", "data"}``:
  ``model_status`` (loading, loaded, unloaded), ``download_progress`` (bytes
  done and total per file), ``download_finished`` / ``download_failed``,
  ``model_remove`` and ``models_reload``. A client that reads too slowly loses
  events past ``QUEUE`` rather than holding the router's memory.
- ``--no-models-autoload``: a request for a model that is not loaded is a 400
  naming ``POST /models/load``, as llama-server answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localllm.router.manage import Job, Manager, PullAnswer
from localllm.router.pool import Pool
from localllm.serve.protocol import FINGERPRINT, RequestError

QUEUE = 256  # events kept for one slow /models/sse client
MAX_CLIENTS = 64  # /models/sse clients at once


class Events:
    """The ``/models/sse`` subscribers and what is published to them."""

    def __init__(self) -> None:
        self.queues: set[asyncio.Queue] = set()

    def publish(self, model: str, event: str, data: object = None) -> None:
        line = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for q in list(self.queues):
            if q.qsize() < QUEUE:
                q.put_nowait(line)

    def stream(self) -> Response:
        if len(self.queues) >= MAX_CLIENTS:
            raise RequestError(503, f"{MAX_CLIENTS} clients follow /models/sse already: retry later", kind="unavailable_error")
        q: asyncio.Queue = asyncio.Queue()
        self.queues.add(q)

        async def lines() -> AsyncIterator[bytes]:
            try:
                yield b": connected\n\n"  # the response starts now: a client knows it is subscribed
                while True:
                    yield f"data: {json.dumps(await q.get())}\n\n".encode()
            finally:
                self.queues.discard(q)

        return StreamingResponse(lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Admin:
    """The routes above, over the router's ``pool`` and ``manage``; ``reload``
    reads the model list and the presets again."""

    def __init__(self, pool: Pool, manage: Manager, *, autoload: bool, reload: Callable[[], None]) -> None:
        self.pool, self.manage = pool, manage
        self.autoload = autoload
        self._reload = reload
        self.events = Events()
        self.downloads: dict[str, Job] = {}
        self._tasks: set[asyncio.Task] = set()
        pool.on_status = lambda name, value: self.events.publish(name, "model_status", {"status": value})

    def props(self) -> dict:
        return {"role": "router", "max_instances": self.pool.models_max, "models_autoload": self.autoload, "build_info": FINGERPRINT}

    def reload(self) -> None:
        self._reload()
        self.events.publish("*", "models_reload")

    def refuse_unloaded(self, name: str) -> None:
        """--no-models-autoload: a model that is not loaded is a 400 (llama-server's answer)."""
        child = self.pool.children.get(name)
        if not self.autoload and (child is None or child.state != "loaded"):
            raise RequestError(400, f"model '{name}' is not loaded and this server does not load models on demand "
                               "(--no-models-autoload): POST /models/load {\"model\": NAME} loads it")

    async def download(self, body: dict) -> Response:
        name = body.get("model")
        answer = await self.manage.pull({"model": name, "stream": True})
        assert isinstance(answer, PullAnswer)
        job = answer.job
        if str(name) not in self.downloads:
            self.downloads[str(name)] = job
            task = asyncio.get_running_loop().create_task(self._follow(str(name), job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return JSONResponse({"success": True})

    def cancel(self, name: object) -> bool:
        """``POST /models/unload`` naming a download in progress: it stops at its next chunk (its part kept)."""
        job = self.downloads.get(str(name))
        if job is None:
            return False
        job.abandon()
        return True

    async def _follow(self, name: str, job: Job) -> None:
        """The job's NDJSON lines as SSE events; the job stops if nobody follows it, so this does."""
        q = job.subscribe()
        last: dict = {}
        try:
            while (line := await q.get()) is not None:
                last = line
                if "digest" in line:
                    self.events.publish(name, "download_progress", {line["digest"]: {"done": line["completed"], "total": line["total"]}})
        finally:
            job.leave(q)
            self.downloads.pop(name, None)
        if "error" in last:
            self.events.publish(name, "download_failed", {"error": last["error"]})
        else:
            self.manage.catalog.invalidate()
            self.events.publish(name, "download_finished")

    async def delete(self, request: Request) -> Response:
        name = request.query_params.get("model")
        if not name:
            raise RequestError(400, "name the model to delete: DELETE /models?model=NAME", param="model")
        await self.manage.delete({"model": name})
        self.events.publish(name, "model_remove")
        return JSONResponse({"success": True})

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
