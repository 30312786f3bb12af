"""Ollama's model management, for the GUIs that drive it (Open WebUI's "pull a
model" box): ``POST /api/pull`` and ``DELETE /api/delete``, through localllm's
own pull and rm (``store.pulling``, ``store.removal``), never the CLI.

Pull (``{"model": NAME, "stream": true}``; older clients send ``"name"``):

- NAME is what ``localllm pull`` takes (a catalog name, ``owner/repo[:QUANT]``,
  ``hf.co/owner/repo[:QUANT]``, a Hub URL), or an Ollama library name the
  catalog has (``llama3.2:1b``: ``pulling.ollama_alias``); ``:latest`` means no
  quant asked. Any other name is a 404 that says which names work, before
  anything is asked of the Hub; a name the router serves already is a success
  with nothing to do. No GPU-budget pick: as Ollama's, the file a name stands
  for does not depend on the machine (the quant asked, else Q4_K_M, else the
  repo's only GGUF).
- The pull runs in a thread of its own (``hub.pull``: resumed, its sha256
  checked, the Hub's answers untrusted); each step comes back to the event loop
  (``loop.call_soon_threadsafe``) and goes out as Ollama's NDJSON: ``pulling
  manifest``, ``pulling <digest>`` with ``total`` and ``completed`` (at most
  every ``THROTTLE_S`` a file, and at its end), then ``verifying sha256 digest``,
  ``writing manifest``, ``success``; an error is a line ``{"error": ...}``.
  ``"stream": false``: one object at the end (``{"status": "success"}``, or a
  500 with the error, as Ollama answers).
- One pull per model asked (its repo and quant): a second request for it joins
  the first and sees its progress from where it is; pulls of the same file
  under two names are one at a time still (``hub.pull`` holds the blob's file
  lock). At most ``MAX_PULLS`` pulls transfer at once; the others wait their turn.
- A client that goes away stops its stream. When the last client of a pull has
  gone, the pull stops at its next chunk (as Ollama's, which follows its
  request): the part downloaded stays in the cache and the next pull of the
  name resumes it with a Range request. A client that joins before the pull has
  stopped keeps it going.
- With ``--models NAME,NAME`` a pulled model would not be served: a 403.

Delete (``{"model": NAME}``): the model the router serves by that name (Ollama
aliases too), deleted as ``localllm rm`` deletes it, refused (403) where
``rm`` refuses (another tool's file) and for a built-in model or a file you
added (localllm did not store it; ``rm`` forgets an added path, which a GUI's
"delete" should not quietly do). A loaded model is unloaded first; one with a
request in flight is a 409 at once (a long stream would otherwise hold the
delete open). 200 with an empty body, as Ollama answers.

Both sit behind the router's key check (``proxy.Router``), as every route but
``/health``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import Response

from localllm.errors import LocalLLMError, UsageError
from localllm.router.catalog import BadName, Catalog, check_name
from localllm.router.pool import Pool
from localllm.serve.protocol import RequestError
from localllm.store import curated, hub, names, pulling, registry, removal
from localllm.store.registry import ModelEntry

MAX_PULLS = 2  # pulls that transfer at once (each also takes a thread and disk bandwidth)
THROTTLE_S = 0.1  # at most this often a progress line per file (the end of a file always)
CLOSE_WAIT_S = 2.0  # how long a stopping router waits for its pulls to stop
MANIFEST = {"status": "pulling manifest"}
SUCCESS = ({"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"})

Log = Callable[[str, str, int, "str | None"], None]
Find = Callable[[object], Awaitable[ModelEntry]]


class NotPullable(Exception):
    """A name that is none of the names a pull takes (a 404 saying which work)."""


class Cancelled(Exception):
    """Every client of a pull has gone, or the router stops: the pull stops at its next chunk."""


def alias(name: object) -> str | None:
    """The catalog's name for an Ollama library name (``llama3.2:1b``), or None."""
    return pulling.ollama_alias(name) if isinstance(name, str) else None


def pull_text(name: str) -> str:
    """What ``pulling.target`` is given for ``name``: an Ollama alias as the catalog's
    name, ``:latest`` dropped; ``NotPullable`` for a name no pull takes."""
    text = alias(name) or name
    if text.lower().endswith(":latest"):
        text = text[: -len(":latest")]
    if names.parse(text) is None and not text.startswith(pulling.HUB_PREFIXES):
        raise NotPullable(name)
    return text


def not_pullable(name: str) -> str:
    catalog = ", ".join(m.name for m in curated.load()[:3])
    ollama = ", ".join(pulling.ollama_names()[:4])
    return (f"model '{name}' cannot be pulled here: /api/pull takes a name localllm pull takes, a model of the catalog "
            f"(localllm list --catalog: {catalog}, ...; :QUANT for another quant), owner/repo[:QUANT] or hf.co/owner/repo[:QUANT] "
            f"of a GGUF repo on the Hugging Face Hub, or an Ollama name the catalog has ({ollama}, ...)")


def delete_refusal(entry: ModelEntry) -> str | None:
    """Why the router will not delete ``entry``: ``localllm rm``'s refusal, and also a
    built-in model and a file you added (localllm did not store it)."""
    if entry.source == "embedded":
        return removal.refusal(entry) or (f"{entry.name} is built into localllm (assembled from its pip package, again at its next use): "
                                          f"not deleted from here; localllm rm {entry.name} deletes the assembled copy")
    if entry.source == "added":
        return (f"{entry.name} is a file you added ({entry.path}): localllm did not store it and deletes nothing of it; "
                f"localllm rm {entry.name} forgets its path")
    return removal.refusal(entry)


def _digest(sha256: str) -> str:
    return f"sha256:{sha256}" if len(sha256) == 64 else sha256


class Job:
    """One pull and the clients that follow it (each an ``asyncio.Queue`` of lines; None ends)."""

    def __init__(self, key: tuple[str, str], name: str) -> None:
        self.key, self.name = key, name
        self.files: dict[str, dict] = {}  # each file's latest progress line, for a client that joins
        self.final: tuple[dict, ...] | None = None
        self.queues: set[asyncio.Queue] = set()
        self.done = asyncio.Event()
        self._lock = threading.Lock()  # wanted/stopped: the event loop and the pull's thread
        self._wanted = True
        self._stopped = False

    def revive(self) -> bool:
        """A client joins: the pull goes on, unless it has stopped already (False)."""
        with self._lock:
            if self._stopped:
                return False
            self._wanted = True
            return True

    def should_stop(self) -> bool:
        """In the pull's thread, at each step: nobody follows it any more (it stops for good)."""
        with self._lock:
            self._stopped = self._stopped or not self._wanted
            return self._stopped

    def abandon(self) -> None:
        with self._lock:
            self._wanted = False

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        for line in (MANIFEST, *self.files.values(), *(self.final or ())):
            q.put_nowait(line)
        if self.final is not None:
            q.put_nowait(None)
        self.queues.add(q)
        return q

    def leave(self, q: asyncio.Queue) -> None:
        self.queues.discard(q)
        if not self.queues and self.final is None:
            self.abandon()

    def publish(self, line: dict) -> None:
        if self.final is not None:
            return
        self.files[line["digest"]] = line
        for q in self.queues:
            q.put_nowait(line)

    def finish(self, lines: tuple[dict, ...]) -> None:
        self.final = lines
        for q in self.queues:
            for line in lines:
                q.put_nowait(line)
            q.put_nowait(None)
        self.done.set()


class Manager:
    """``/api/pull`` and ``/api/delete`` for the router: ``catalog`` (refreshed after
    each), ``pool`` (a deleted model is unloaded), ``find`` (the router's name lookup,
    its errors already the client's), ``log`` (the router's line)."""

    def __init__(self, catalog: Catalog, pool: Pool, *, find: Find, log: Log) -> None:
        self.catalog, self.pool, self.find, self.log = catalog, pool, find, log
        self.jobs: dict[tuple[str, str], Job] = {}
        self.slots = asyncio.Semaphore(MAX_PULLS)
        self._tasks: set[asyncio.Task] = set()

    # -- pull -----------------------------------------------------------------------

    async def pull(self, body: dict) -> Response:
        name = body.get("model") or body.get("name")
        stream = body.get("stream", True)
        if stream is None:
            stream = True
        if not isinstance(stream, bool):
            raise RequestError(400, "'stream' must be true or false", param="stream")
        try:
            name = check_name(name)
        except BadName as exc:
            raise RequestError(400, str(exc), param="model") from None
        if self.catalog.only is not None:
            raise RequestError(403, "this router serves only the models --models names: a model pulled now would not be served; "
                               "run localllm pull, or serve without --models")
        try:
            text = await asyncio.to_thread(pull_text, name)
            repo_id, quant = await asyncio.to_thread(pulling.target, text)
        except NotPullable:
            if await self._served(name):
                here = Job(("", name), name)  # nothing to download: it is here
                here.finish(SUCCESS)
                return PullAnswer(here, stream)
            raise RequestError(404, not_pullable(name), param="model") from None
        except UsageError as exc:
            raise RequestError(400, str(exc), param="model") from None
        except LocalLLMError as exc:  # a catalog name with a quant the catalog lacks
            raise RequestError(404, str(exc), param="model") from None
        key = (repo_id.lower(), (quant or "").upper())
        job: Job | None = self.jobs.get(key)
        while job is not None and not job.revive():  # it stopped: let it end, then pull anew (resuming its part)
            await job.done.wait()
            job = self.jobs.get(key)
        if job is None:
            job = Job(key, name)
            self.jobs[key] = job
            self._spawn(self._run(job, text))
        return PullAnswer(job, stream)

    async def _served(self, name: str) -> bool:
        try:
            await self.find(name)
            return True
        except RequestError:
            return False

    async def _run(self, job: Job, text: str) -> None:
        try:
            async with self.slots:
                if job.should_stop():
                    raise Cancelled
                hook = self._hook(job, asyncio.get_running_loop())
                result = await _in_thread(lambda: pulling.pull(text, on_progress=hook))
        except Cancelled:
            job.finish(({"error": f"the pull of {job.name} stopped: its clients went away (what was downloaded is kept: "
                                  "pull it again to resume)"},))
            self.log("POST", "/api/pull", 499, f"{job.name}: stopped, every client went away")
        except LocalLLMError as exc:
            job.finish(({"error": str(exc)},))
            self.log("POST", "/api/pull", 200, f"{job.name}: error: {exc}")
        except Exception as exc:  # a bug, or an error of a kind hub.pull does not turn into one line
            job.finish(({"error": f"the pull of {job.name} failed ({type(exc).__name__}): {exc}"},))
            self.log("POST", "/api/pull", 500, f"{job.name}: {type(exc).__name__}: {exc}")
        else:
            self._refresh()
            job.finish(SUCCESS)
            got = "in the cache already" if result.from_cache else f"{result.downloaded_bytes} bytes downloaded, sha256 verified"
            self.log("POST", "/api/pull", 200, f"pulled {job.name} as {result.name} ({got})")
        finally:
            if self.jobs.get(job.key) is job:
                del self.jobs[job.key]

    def _hook(self, job: Job, loop: asyncio.AbstractEventLoop) -> hub.OnProgress:
        """The pull's ``on_progress``, in its thread: stop when nobody follows, else a line to the loop."""
        last: dict[str, float] = {}

        def hook(p: hub.Progress) -> None:
            if job.should_stop():
                raise Cancelled
            now = time.monotonic()
            if p.completed < p.total and now - last.get(p.filename, -THROTTLE_S) < THROTTLE_S:
                return
            last[p.filename] = now
            line = {"status": f"pulling {p.sha256[:12]}", "digest": _digest(p.sha256), "total": p.total, "completed": p.completed}
            loop.call_soon_threadsafe(job.publish, line)

        return hook

    # -- delete ---------------------------------------------------------------------

    async def delete(self, body: dict) -> Response:
        entry = await self.find(body.get("model") or body.get("name"))
        fresh = await asyncio.to_thread(_fresh, entry.name)  # the record as it is now, not as the catalog read it
        if fresh is None:
            raise RequestError(404, f"model '{entry.name}' not found", param="model")
        why = delete_refusal(fresh)
        if why is not None:
            raise RequestError(403, why, param="model")
        child = self.pool.children.get(entry.name)
        if child is not None and child.in_flight > 0:
            raise RequestError(409, f"{entry.name} is answering {child.in_flight} request(s): delete it when they are done")
        if child is not None:
            await self.pool.unload(entry.name)
        try:
            removed = await asyncio.to_thread(removal.remove, fresh)
        except (OSError, LocalLLMError) as exc:
            raise RequestError(500, f"cannot delete {entry.name}: {exc}") from None
        finally:
            self._refresh()
        self.log("DELETE", "/api/delete", 200, f"deleted {entry.name}: {', '.join(removed.deleted) or 'nothing left on disk'}")
        return Response(status_code=200)

    # -- the rest -------------------------------------------------------------------

    def _refresh(self) -> None:
        """The catalog reads the registry again at its next use (a pulled model is
        listed, a deleted one gone, at once rather than after its ``TTL_S``)."""
        self.catalog.invalidate()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """The router stops: every pull stops at its next chunk (its part kept); wait a little for them."""
        for job in list(self.jobs.values()):
            job.abandon()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CLOSE_WAIT_S)


def _fresh(name: str) -> ModelEntry | None:
    try:
        return registry.find(name)
    except LocalLLMError:
        return None


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a daemon thread of its own (not the loop's executor, which a stopping
    router would wait for while a stalled download runs out its retries)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def work() -> None:
        try:
            value, exc = fn(), None
        except BaseException as e:  # handed to the awaiting task, whatever it is
            value, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:
            pass  # the loop has closed: nobody waits

    threading.Thread(target=work, name="localllm-pull", daemon=True).start()
    return await fut


class PullAnswer(Response):
    """The answer to one ``/api/pull``: the job's lines as NDJSON as they come
    (``stream``), or its outcome as one object; the client going away ends it."""

    media_type = "application/x-ndjson"

    def __init__(self, job: Job, stream: bool) -> None:
        super().__init__(status_code=200)
        self.job, self.stream = job, stream

    async def __call__(self, scope, receive, send) -> None:
        q = self.job.subscribe()
        try:
            await until_gone(self._lines(q, send) if self.stream else self._outcome(q, send), receive)
        finally:
            self.job.leave(q)

    async def _lines(self, q: asyncio.Queue, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/x-ndjson")]})
        while (line := await q.get()) is not None:
            await send({"type": "http.response.body", "body": json.dumps(line).encode() + b"\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _outcome(self, q: asyncio.Queue, send) -> None:
        last: dict = {}
        while (line := await q.get()) is not None:
            last = line
        failed = "error" in last
        body = json.dumps(last if failed else {"status": "success"}).encode()
        await send({"type": "http.response.start", "status": 500 if failed else 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def until_gone(work: Awaitable[None], receive) -> None:
    """``work`` until it ends or the client goes (``http.disconnect``), whichever comes first."""
    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    tasks = [asyncio.ensure_future(work), asyncio.ensure_future(gone())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

