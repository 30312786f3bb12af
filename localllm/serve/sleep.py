"""``serve MODEL --sleep-idle-seconds N`` (or ``--keep-alive``): the model is
freed after N seconds without a request and loaded again by the next one, as
llama-server's sleeping server does (its tools/server/tests/unit/test_sleep.py).

While asleep, ``GET /health``, ``/props``, ``/models``, ``/v1/models`` and
``/metrics`` answer without waking it: the first four from what they answered
just before it slept (``/props`` then says ``"is_sleeping": true``), ``/metrics``
with what it last answered when nothing ran since (llama-server's snapshot), else
from the server's counters, which go on across the sleep (nothing runs, so its
throughput window reads empty once scraped). Any other request wakes it: the
model loads again (the load path's plan, unchanged) and the request is served.

Only a server that loaded its model sleeps (``Server`` given a ``Planned``): a
model a program handed it stays that program's.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, PlainTextResponse

from localllm.serve import inprocess
from localllm.serve.app import PUBLIC, authorized, no_metrics, unauthorized

READ_ONLY = ("/health", "/v1/health", "/props", "/models", "/v1/models")  # answered asleep from their last answer
TICK_S = 0.2


class Sleeper:
    """ASGI app in front of the served app: counts the requests in flight, frees
    the model after ``idle_s`` without one (``unload``) and loads it again for the
    next (``load``, which returns the new app). ``metrics``: the server's
    ``ServerMetrics``, rendered while asleep."""

    def __init__(self, app: Callable, idle_s: float, *, unload: Callable[[], None], load: Callable[[], Callable],
                 metrics: Any, metrics_endpoint: bool, api_key: str | None = None) -> None:
        self._key = api_key.encode() if api_key else None  # what the app's Guard asks, asked here while it sleeps
        self.app, self.idle_s = app, idle_s
        self._unload, self._load = unload, load
        self.metrics, self.metrics_endpoint = metrics, metrics_endpoint
        self.sleeping = False
        self.active = 0
        self.last = time.monotonic()
        self._lock = threading.Lock()  # active, sleeping, last: the event loop and the watcher
        self._transition = threading.Lock()  # a sleep or a wake in progress
        self._cache: dict[str, inprocess.Answer] = {}
        self._scraped: bytes | None = None  # the last /metrics answer since the last work: what a sleeping server shows again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="localllm-sleep", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._loop = asyncio.get_running_loop()
        path, method = scope.get("path", ""), scope.get("method", "")
        while True:
            with self._lock:
                if not self.sleeping:
                    self.active += 1
                    break
            if self._key is not None and path not in PUBLIC and not authorized(scope, self._key):
                await unauthorized(path)(scope, receive, send)
                return
            if method == "GET" and path in READ_ONLY and path in self._cache:
                await self._cached(path, scope, receive, send)
                return
            if method == "GET" and path == "/metrics":
                await self._metrics(scope, receive, send)
                return
            await run_in_threadpool(self._wake)
        work = not (method == "GET" and (path in READ_ONLY or path == "/metrics"))  # a look at the server is not work that keeps it awake
        if work:
            self._scraped = None
        elif path == "/metrics" and self.metrics_endpoint:
            send = self._keeping(send)
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                self.active -= 1
                if work:
                    self.last = time.monotonic()

    async def _cached(self, path: str, scope, receive, send) -> None:
        answer = self._cache[path]
        status, body, kind = answer.status, answer.body, answer.content_type
        if path == "/props" and status == 200:
            body = json.dumps({**json.loads(body), "is_sleeping": True}).encode()
        await JSONResponse(json.loads(body), status_code=status)(scope, receive, send) if "json" in kind else \
            await PlainTextResponse(body.decode("utf-8", "replace"), status_code=status)(scope, receive, send)

    def _keeping(self, send: Callable) -> Callable:
        """``send``, keeping the body of a /metrics answer (llama-server's snapshot: asleep, it shows what it last showed)."""
        body: list[bytes] = []

        async def keep(message: dict) -> None:
            if message["type"] == "http.response.body":
                body.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._scraped = b"".join(body)
            await send(message)

        return keep

    async def _metrics(self, scope, receive, send) -> None:
        if not self.metrics_endpoint:  # the app's answer (app.py), which is asleep
            await no_metrics()(scope, receive, send)
            return
        # what it last answered, if nothing ran since (llama-server's snapshot); else the counters as they stand, the window emptied as read
        text = self._scraped.decode("utf-8") if self._scraped is not None else self.metrics.render()
        resp = PlainTextResponse(text, media_type="text/plain; version=0.0.4")
        resp.raw_headers.append((b"Process-Start-Time-Unix", str(int(self.metrics.started)).encode()))
        await resp(scope, receive, send)

    def _watch(self) -> None:
        """The watcher thread: asleep once nothing ran for ``idle_s``."""
        while not self._stop.wait(TICK_S):
            with self._lock:
                idle = not self.sleeping and self.active == 0 and time.monotonic() - self.last >= self.idle_s
            if idle and self._loop is not None:
                self._sleep()

    def _sleep(self) -> None:
        with self._transition:
            loop = self._loop
            assert loop is not None
            cache = {}
            for path in READ_ONLY:  # what answers while asleep, as the app answered it just now (/metrics renders live)
                try:
                    cache[path] = asyncio.run_coroutine_threadsafe(inprocess.call(self.app, "GET", path, internal=True), loop).result(10)
                except Exception:  # noqa: BLE001 - a route that failed is answered by the waking path instead
                    continue
            with self._lock:
                if self.active or time.monotonic() - self.last < self.idle_s:  # a request came in meanwhile
                    return
                self.sleeping = True
            self._cache = cache
            self._unload()

    def _wake(self) -> None:
        """In a worker thread: load the model again (once, whoever asks first)."""
        with self._transition:
            if not self.sleeping:
                return
            self.app = self._load()
            with self._lock:
                self.sleeping = False
                self.last = time.monotonic()
