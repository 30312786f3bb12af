"""Which models are loaded: started on demand, stopped when idle or when room is needed.

Everything here runs on the router's event loop, so a decision (is a child
there? start one) is taken without an ``await`` between looking and acting:
concurrent first requests for a model find the one child the first of them
put in ``children`` and wait for its load; there are never two.

- ``--models-max N`` caps the children (loading, loaded and stopping alike: a
  stopping child still holds its memory). To load another, the least recently
  used child with no request in flight is stopped; when every child is busy, a
  request waits for one to become idle, at most ``WAIT_S`` and at most
  ``max_waiting`` requests at once, then gets a 503 with ``Retry-After``.
- A child with a request in flight is never stopped, neither for room nor for
  idleness; ``unload`` waits for its requests.
- After each request a child's expiry is set from the request's ``keep_alive``
  (Ollama's) or the server's default (``--keep-alive``); ``0`` stops it at once,
  ``None`` never. ``reap`` stops the children past their expiry.
- A child that fails to load fails the requests waiting for it (``LoadFailed``,
  with its last error line) and leaves the pool: the next request tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from localllm.router import durations
from localllm.router.catalog import path_of
from localllm.router.children import Child, ChildFailed, Spawn
from localllm.store.registry import ModelEntry

WAIT_S = 60.0  # a request waits this long for a busy child to become idle
LOAD_S = 600.0  # a model that has not said it is serving by then is stopped
REAP_S = 0.5
DEFAULT = object()  # "the request gave no keep_alive"


class LoadFailed(Exception):
    """The model could not be loaded (a 502, with the child's last error line)."""


class Busy(Exception):
    """No room for the model now (a 503 with Retry-After)."""


class Pool:
    def __init__(self, spawn: Spawn, *, models_max: int, keep_alive: float | None, max_waiting: int, say: Callable[[str], None],
                 json_log: bool = False, wait_s: float = WAIT_S) -> None:
        self.spawn = spawn
        self.models_max = models_max  # 0: no cap
        self.keep_alive = keep_alive
        self.max_waiting = max_waiting
        self.say = say
        self.json_log = json_log
        self.wait_s = wait_s
        self.children: dict[str, Child] = {}
        self.loads = 0  # children started, for the log and the tests
        self.closing = False  # the router is stopping: children that end now are not failures
        self._changed = asyncio.Event()
        self._waiting = 0
        self._tasks: set[asyncio.Task] = set()

    # -- use -----------------------------------------------------------------------

    @asynccontextmanager
    async def use(self, entry: ModelEntry, keep_alive: object = DEFAULT) -> AsyncIterator[Child]:
        """``entry``'s child, loaded, with this request counted in flight until the block ends."""
        child = await self.acquire(entry)
        try:
            yield child
        finally:
            self.release(child, keep_alive)

    async def acquire(self, entry: ModelEntry) -> Child:
        """``entry``'s child once it serves, counted in flight (``release`` when done): started
        if need be, after room is made; ``LoadFailed`` if it cannot load, ``Busy`` if no room comes."""
        deadline = time.monotonic() + self.wait_s
        while True:
            child = self.children.get(entry.name)
            if child is not None and child.state == "stopping":
                await child.exited.wait()
                continue
            if child is not None:
                child.in_flight += 1
                try:
                    await asyncio.shield(child.ready)
                except ChildFailed as exc:
                    child.in_flight -= 1
                    raise LoadFailed(str(exc)) from None
                except BaseException:
                    child.in_flight -= 1
                    raise
                if child.state != "loaded":  # it exited between its load and this request
                    child.in_flight -= 1
                    continue
                child.last_used = time.monotonic()
                return child
            if self._room():
                self._start(entry)
                continue
            if any(c.state == "stopping" for c in self.children.values()):  # room is being made: wait for it, stop no other
                await self._wait_change(deadline, entry, queued=False)
                continue
            victim = self._idlest()
            if victim is not None:
                self._stop(victim, f"to make room for {entry.name} (--models-max {self.models_max})")
                continue
            await self._wait_change(deadline, entry, queued=True)

    def release(self, child: Child, keep_alive: object = DEFAULT) -> None:
        """The request is done: set the child's expiry (``keep_alive``: seconds, or None for never)."""
        child.in_flight -= 1
        now = time.monotonic()
        child.last_used = now
        ttl = self.keep_alive if keep_alive is DEFAULT else keep_alive
        assert ttl is None or isinstance(ttl, (int, float))
        child.expires_at = None if ttl is None else now + ttl
        child.expires_wall = None if ttl is None else time.time() + ttl
        if ttl == 0 and child.in_flight == 0 and child.state == "loaded":
            self._stop(child, "keep_alive 0")
        self._notify()

    async def load(self, entry: ModelEntry) -> None:
        """Load ``entry`` (llama-server's POST /models/load), as a request without keep_alive would."""
        async with self.use(entry):
            pass

    async def unload(self, name: str) -> bool:
        """Stop the model once its requests are done (POST /models/unload); False when it was not loaded."""
        child = self.children.get(name)
        if child is None:
            return False
        try:
            await asyncio.shield(child.ready)
        except ChildFailed:
            return True
        while child.in_flight > 0 and child.state in ("loading", "loaded"):
            changed = self._changed
            await changed.wait()
        if child.state in ("loading", "loaded"):
            self._stop(child, "unloaded by request")
        await child.exited.wait()
        return True

    # -- residency -----------------------------------------------------------------

    def _room(self) -> bool:
        return self.models_max == 0 or len(self.children) < self.models_max

    def _idlest(self) -> Child | None:
        idle = [c for c in self.children.values() if c.state == "loaded" and c.in_flight == 0]
        return min(idle, key=lambda c: c.last_used) if idle else None

    async def _wait_change(self, deadline: float, entry: ModelEntry, *, queued: bool) -> None:
        left = deadline - time.monotonic()
        busy = ", ".join(f"{c.name} ({c.in_flight} in flight)" for c in self.children.values())
        if left <= 0 or (queued and self._waiting >= self.max_waiting):
            raise Busy(f"cannot load {entry.name} now: --models-max {self.models_max} models are loaded and busy ({busy}); retry later")
        changed = self._changed
        self._waiting += queued
        try:
            await asyncio.wait_for(changed.wait(), left)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiting -= queued

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _start(self, entry: ModelEntry) -> None:
        child = Child(entry.name, self.say, json_log=self.json_log)
        self.children[entry.name] = child
        self.loads += 1
        self._spawn_task(self._load(child, entry))

    async def _load(self, child: Child, entry: ModelEntry) -> None:
        try:
            path = await asyncio.to_thread(path_of, entry)  # a built-in model is assembled here on first use
            if child.stop_asked:
                raise ChildFailed(f"{entry.name} was unloaded while it was loading")
            self.say(f"loading {entry.name} ({path})")
            await child.start(self.spawn, path, self._exited)
            await asyncio.wait_for(asyncio.shield(child.ready), LOAD_S)
        except ChildFailed as exc:
            if not child.ready.done():
                child.ready.set_exception(exc)
            if not child.spawned.is_set():
                child.abandon()
                self._exited(child)
            if not self.closing:
                self.say(f"{exc}")
            return
        except asyncio.TimeoutError:
            child.ready.set_exception(ChildFailed(f"{entry.name} did not load within {LOAD_S:g} s: {child.last_error}"))
            self.say(f"{entry.name} did not load within {LOAD_S:g} s: stopping it")
            await child.stop()
            return
        except Exception as exc:  # the file is gone, cannot be assembled, or the process cannot start
            if not child.ready.done():
                child.ready.set_exception(ChildFailed(f"{entry.name} did not load: {exc}"))
            self.say(f"{entry.name} did not load: {exc}")
            if not child.spawned.is_set():
                child.abandon()
            self._exited(child)
            return
        self.say(f"loaded {entry.name} in {time.monotonic() - child.started:.1f} s (pid {child.pid}, {child.url})")

    def _exited(self, child: Child) -> None:
        child.state = "stopped"
        child.exited.set()
        if self.children.get(child.name) is child:
            del self.children[child.name]
            if child.url is not None and not child.stop_asked and not self.closing:
                self.say(f"{child.name} exited (code {child.returncode}): {child.last_error}")
        self._notify()

    def _stop(self, child: Child, why: str) -> None:
        if child.state == "stopping" or child.state == "stopped":
            return
        self.say(f"unloading {child.name}: {why}")
        child.state = "stopping"
        self._spawn_task(self._stop_child(child))

    async def _stop_child(self, child: Child) -> None:
        await child.stop()
        self._exited(child)

    def _spawn_task(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reap(self) -> None:
        """Forever: stop the idle children past their expiry (run as a task)."""
        while True:
            await asyncio.sleep(REAP_S)
            now = time.monotonic()
            for child in list(self.children.values()):
                if child.state == "loaded" and child.in_flight == 0 and child.expires_at is not None and now >= child.expires_at:
                    idle = now - child.last_used
                    self._stop(child, f"idle for {durations.shown(round(idle))}")

    # -- the end -------------------------------------------------------------------

    def abort(self) -> int:
        """A second signal: every child ends its requests now (two SIGINTs: serve's first
        drains, its second ends what runs with an error). Returns the requests in flight."""
        n = 0
        loop = asyncio.get_running_loop()
        for child in list(self.children.values()):
            n += child.in_flight
            child.interrupt()
            loop.call_later(0.1, child.interrupt)  # apart, so that the two are not merged into one pending signal
        return n

    async def close(self) -> None:
        """Stop every child and wait for them (the router is stopping)."""
        children = list(self.children.values())
        for child in children:
            child.state = "stopping" if child.state != "stopped" else child.state
        await asyncio.gather(*(self._stop_child(c) for c in children), return_exceptions=True)
