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
- With a memory plan (``residency.Memory``), each model is fitted before its
  first load (in a thread: llama.cpp's dry run runs in a child process; kept
  until its file changes) and loads only where its planned bytes fit beside
  the resident models': else the least recently used idle ones are stopped
  first, or the request waits for a busy one as above. A model that does not
  fit even alone is refused at once (``DoesNotFit``), and nothing is stopped
  for it. ``residency`` decides; this module acts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.router import durations, residency
from localllm.router.catalog import path_of
from localllm.router.children import Child, ChildFailed, Spares, Spawn
from localllm.runtime import errors as runtime_errors
from localllm.store.registry import ModelEntry
from localllm.util import fmt

WAIT_S = 60.0  # a request waits this long for a busy child to become idle
LOAD_S = 600.0  # a model that has not said it is serving by then is stopped
REAP_S = 0.5
DEFAULT = object()  # "the request gave no keep_alive"


class LoadFailed(Exception):
    """The model could not be loaded (a 502, with the child's last error line)."""


class DoesNotFit(LoadFailed, runtime_errors.DoesNotFit):
    """The model does not fit this machine even with no other model loaded: the
    message is the plan's reason (the proxy answers 507). The load path's
    ``DoesNotFit``, as the router raises it: a ``LoadFailed`` to the pool too."""


class Busy(Exception):
    """No room for the model now (a 503 with Retry-After)."""


@dataclass(frozen=True)
class Planned:
    """A model file's fit, or why it has none; kept while the file is unchanged."""

    key: tuple[str, int, int]  # path, size, mtime_ns
    path: Path
    plan: Any = None  # prepare.LoadPlan
    error: LoadFailed | None = None


class Pool:
    def __init__(self, spawn: Spawn, *, models_max: int, keep_alive: float | None, max_waiting: int, say: Callable[[str], None],
                 json_log: bool = False, wait_s: float = WAIT_S, memory: residency.Memory | None = None) -> None:
        self.spawn = spawn
        self.models_max = models_max  # 0: no cap
        self.keep_alive = keep_alive
        self.max_waiting = max_waiting
        self.say = say
        self.json_log = json_log
        self.wait_s = wait_s
        self.memory = memory  # None: only --models-max decides (no plan: --rpc, or the pool's own tests)
        self.children: dict[str, Child] = {}
        self.spares = Spares(spawn)  # started by the router (it needs the running loop): pool.spares.start()
        self.on_status: Callable[[str, str], None] = lambda name, value: None  # llama-server's model_status events (llama_admin)
        self.kept: set[str] = set()  # loaded at start (the config's default model, a preset's load-on-startup): never unloaded for being idle
        self._plans: dict[str, Planned] = {}
        self._planning: dict[str, asyncio.Future[Planned]] = {}
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
            planned = None
            if self.memory is not None:
                planned = self._planned(entry)
                if planned is None:
                    planned = await self._plan(entry)
                    if planned.error is None:
                        continue  # the fit took a while: look again at the children
                if planned.error is not None:
                    raise type(planned.error)(str(planned.error))  # a fresh one: a kept exception would gather tracebacks
            decision = self._decide(planned)
            if decision.action == "load":
                self._start(entry, planned)
                continue
            if decision.action == "never":  # the plan fits, but not the budget the pool shares (not expected: the same figures)
                raise DoesNotFit(f"{entry.name} does not fit: {decision.why}")
            if any(c.state == "stopping" for c in self.children.values()):  # room is being made: wait for it, stop no other
                await self._wait_change(deadline, entry, decision.why, queued=False)
                continue
            if decision.action == "unload":
                for name in decision.victims:
                    self._stop(self.children[name], f"to make room for {entry.name} ({decision.why})")
                continue
            if decision.action == "refuse":
                raise Busy(f"cannot load {entry.name} now: {decision.why}, and no model is loaded to make room; retry later")
            await self._wait_change(deadline, entry, decision.why, queued=True)

    def release(self, child: Child, keep_alive: object = DEFAULT) -> None:
        """The request is done: set the child's expiry (``keep_alive``: seconds, or None for never)."""
        child.in_flight -= 1
        now = time.monotonic()
        child.last_used = now
        ttl = (None if child.name in self.kept else self.keep_alive) if keep_alive is DEFAULT else keep_alive
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

    def _decide(self, planned: Planned | None) -> residency.Decision:
        """What to do to load the model of ``planned`` (None: no memory plan) beside the children now."""
        residents = [residency.Resident(c.name, c.need or residency.Need(0, 0), c.state == "loaded" and c.in_flight == 0, c.last_used)
                     for c in self.children.values()]
        memory = self.memory
        if memory is None or planned is None:
            return residency.decide(None, residents, None, 0, slots=self.models_max)
        return residency.decide(residency.Need.of(planned.plan), residents, memory.budget, memory.ram_now(), slots=self.models_max)

    def forget_plans(self) -> None:
        """Fit every model again at its next load (its options may have changed: POST /models/reload)."""
        self._plans.clear()

    def _planned(self, entry: ModelEntry) -> Planned | None:
        """``entry``'s fit, if one was made for its file as it is now."""
        known = self._plans.get(entry.name)
        if known is None:
            return None
        try:
            st = known.path.stat()
        except OSError:
            return None
        return known if known.key == (str(known.path), st.st_size, st.st_mtime_ns) else None

    async def _plan(self, entry: ModelEntry) -> Planned:
        """Fit ``entry``, once for concurrent requests; kept in ``_plans``, a failure included.

        The fit is kept by whoever sees it finished, not only by its done callback:
        a request that arrives after the fit ends but before the loop runs that
        callback gets the finished future back without yielding, and ``acquire``
        would look for the plan again and again without ever letting the callback
        run (CI saw three first requests for one model hang so)."""
        name = entry.name
        running = self._planning.get(name)
        if running is None:
            running = asyncio.ensure_future(asyncio.to_thread(self._fit, entry))
            self._planning[name] = running
            running.add_done_callback(lambda f: self._keep(name, f))
        planned = await asyncio.shield(running)
        self._keep(name, running)
        return planned

    def _keep(self, name: str, running: asyncio.Future[Planned]) -> None:
        """``running``'s fit into ``_plans`` (once it ended without an exception), and out of ``_planning``."""
        if self._planning.get(name) is running:
            del self._planning[name]
            if not running.cancelled() and running.exception() is None:
                self._plans[name] = running.result()

    def _fit(self, entry: ModelEntry) -> Planned:
        """Blocking: the file (a built-in model is assembled on first use) and its fit."""
        memory = self.memory
        assert memory is not None
        try:
            path = path_of(entry)
            st = path.stat()
        except Exception as exc:  # the file is gone, or cannot be assembled
            path = entry.path
            return Planned((str(path), -1, -1), path, error=LoadFailed(f"{entry.name} did not load: {exc}"))
        key = (str(path), st.st_size, st.st_mtime_ns)
        try:
            plan = memory.plan(path, entry.name)
        except Exception as exc:  # a header that cannot be read, a config llama.cpp refuses
            return Planned(key, path, error=LoadFailed(f"{entry.name} did not load: {exc}"))
        if not plan.fit.fits:
            return Planned(key, path, plan, DoesNotFit(f"{entry.name} does not fit: {plan.fit.sentence}"))
        return Planned(key, path, plan)

    async def _wait_change(self, deadline: float, entry: ModelEntry, why: str, *, queued: bool) -> None:
        left = deadline - time.monotonic()
        busy = ", ".join(f"{c.name} ({c.in_flight} in flight)" for c in self.children.values())
        if left <= 0 or (queued and self._waiting >= self.max_waiting):
            if why.startswith("--models-max"):
                raise Busy(f"cannot load {entry.name} now: {why} models are loaded and busy ({busy}); retry later")
            raise Busy(f"cannot load {entry.name} now: {why}, and the models loaded are busy ({busy}); retry later")
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

    def _start(self, entry: ModelEntry, planned: Planned | None) -> None:
        child = Child(entry.name, self.say, json_log=self.json_log)
        if planned is not None:
            child.plan, child.need = planned.plan, residency.Need.of(planned.plan)
        self.children[entry.name] = child
        self.loads += 1
        self.on_status(entry.name, "loading")
        self._spawn_task(self._load(child, entry, planned.path if planned is not None else None))

    async def _load(self, child: Child, entry: ModelEntry, path: Path | None) -> None:
        try:
            if path is None:
                path = await asyncio.to_thread(path_of, entry)  # a built-in model is assembled here on first use
            if child.stop_asked:
                raise ChildFailed(f"{entry.name} was unloaded while it was loading")
            self.say(f"loading {entry.name} ({path}{_planned_words(child.plan)})")
            await child.start(self.spawn, path, self._exited, spare=await self.spares.take())
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
        self.on_status(entry.name, "loaded")

    def _exited(self, child: Child) -> None:
        child.state = "stopped"
        child.exited.set()
        if self.children.get(child.name) is child:
            del self.children[child.name]
            self.on_status(child.name, "unloaded")
            if child.url is not None and not child.stop_asked and not self.closing:
                self.say(f"{child.name} exited ({child.ending()})")
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
        await asyncio.gather(self.spares.close(), *(self._stop_child(c) for c in children), return_exceptions=True)


def _planned_words(plan: Any) -> str:
    """``; planned GPU 104.61 MiB, RAM 28.88 MiB, context 256: fits as asked`` (nothing without a plan)."""
    if plan is None:
        return ""
    gpu, cpu = plan.total
    on_gpu = f"GPU {fmt.size(gpu)}, " if plan.fit.gpu_budget is not None else ""
    return f"; planned {on_gpu}RAM {fmt.size(cpu)}, context {plan.config.n_ctx}: {plan.fit.sentence}"
