"""The router's life: listen, proxy, stop the children on the way out.

It runs on uvicorn with serve's bounded HTTP protocol (``serve.accept``) and
stops as serve does (``serve.lifecycle.Server``): the first SIGINT or SIGTERM
stops accepting and lets the running requests finish, for up to the grace
period; a second one (or the grace period's end) sends every child its own
second SIGINT, which ends their requests with an error event. Then every
child is stopped and waited for, so no model outlives the router.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from localllm.router import durations, residency
from localllm.router.catalog import Catalog
from localllm.router.children import Spawn
from localllm.router.pool import Pool
from localllm.router.proxy import Router
from localllm.router.tools import ToolsGate
from localllm.serve.accept import MAX_HEAD_BYTES, bounded
from localllm.serve.cors import with_cors
from localllm.serve.lifecycle import Server


@dataclass(frozen=True)
class Settings:
    """What ``localllm serve`` in router mode was asked for."""

    only: tuple[str, ...] | None  # --models NAME,NAME (canonical names); None: every model of localllm list
    models_max: int  # --models-max (0: no cap)
    keep_alive: float | None  # seconds an idle model stays loaded; None: for ever
    max_waiting: int  # requests that may wait for room at once (--max-queue)
    api_key: str | None
    cors: tuple[str, ...] = ()
    json_log: bool = False
    top: tuple[str, ...] = ()  # localllm's own flags for each child (-v, --debug)
    options: tuple[str, ...] = ()  # serve's per-model options for each child
    per_model: Callable[[str], tuple[str, ...]] | None = None  # a model's own options (its config table, its preset section), by name
    models_autoload: bool = True  # --no-models-autoload: only POST /models/load loads
    reload: Callable[[], None] | None = None  # read the models' options again (POST /models/reload)
    autoload: tuple[str, ...] = ()  # loaded at start and kept while idle: the config's default model, preset's load-on-startup
    memory: residency.Memory | None = None  # the memory plan that decides which models fit together; None: --models-max alone
    header_timeout: float | None = None  # --timeout: seconds for a request's head (serve.accept.bounded)
    # GET/POST /tools (router.tools): a started localllm.mcp.Hub of --mcp-servers-config/--mcp-servers-json (the command
    # starts it and closes it after run() returns), and the built-in tools --tools chose (localllm.server_tools.choose)
    mcp: object | None = None
    tools: tuple[str, ...] = ()


def run(socks: list[socket.socket], settings: Settings, say: Callable[[str], None]) -> int:
    """Serve on ``socks`` until a signal stops the router; returns the exit code."""
    key = secrets.token_urlsafe(32)  # the children's: neither the user's key nor on any command line
    private = tempfile.mkdtemp(prefix="localllm-router-")
    spawn = Spawn(head=(sys.executable, "-m", "localllm", *settings.top, "serve"), options=settings.options, key=key,
                  config=os.path.join(private, "no-config.toml"), per_model=settings.per_model)
    catalog = Catalog(settings.only)
    port = socks[0].getsockname()[1]
    urls = " and ".join(f"http://{_shown(s.getsockname()[0])}:{port}/v1" for s in socks)
    state: dict = {}

    async def main() -> None:
        pool = Pool(spawn, models_max=settings.models_max, keep_alive=settings.keep_alive, max_waiting=settings.max_waiting, say=say,
                    json_log=settings.json_log, memory=settings.memory)
        def reload() -> None:
            catalog.invalidate()
            if settings.reload is not None:
                settings.reload()
            pool.forget_plans()

        router = Router(catalog, pool, key=settings.api_key, internal_key=key, json_log=settings.json_log,
                        autoload=settings.models_autoload, reload=reload)
        gate = ToolsGate(router, key=settings.api_key, mcp=settings.mcp, tools=settings.tools, log=router.log, count=lambda: _count(router))
        state.update(pool=pool, router=router)
        config = uvicorn.Config(with_cors(gate, settings.cors), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=None, http=bounded(settings.header_timeout), limit_concurrency=None,
                                h11_max_incomplete_event_size=MAX_HEAD_BYTES, server_header=False, date_header=False)
        server = _RouterServer(config, pool, gate)
        state["server"] = server
        served = [e.name for e in await catalog.entries()]
        cap = f"at most {settings.models_max} at once" if settings.models_max else "no cap on how many"
        if settings.memory is not None:
            fit = f"as many as fit {settings.memory.budget.words()}"
            cap = f"{cap} and {fit}" if settings.models_max else fit
        say(f"serving {len(served)} model(s) on {urls} (loaded on demand, {cap}, unloaded after {durations.shown(settings.keep_alive)} "
            f"idle: {', '.join(served) or 'none yet: localllm pull or localllm add one'}{'; API key required' if settings.api_key else ''})"
            "; Ctrl+C stops")
        if settings.tools:
            say(f"built-in tools on GET/POST /tools: {', '.join(settings.tools)} (experimental, llama-server's: they read, write and run "
                "what this user may, for whoever can reach the API)")
        reaper = asyncio.create_task(pool.reap())
        pool.spares.start()  # the next model's process, its imports done before a request needs it (localllm.spare)
        pool.kept.update(settings.autoload)
        starting = [asyncio.create_task(_autoload(catalog, pool, name, say)) for name in settings.autoload]
        try:
            await server.serve(sockets=socks)
        finally:
            pool.closing = True
            reaper.cancel()
            for task in starting:
                task.cancel()
            gate.abort()  # stops the built-in tools' commands, if any still run
            await pool.close()
            await router.aclose()

    previous = {sig: signal.signal(sig, lambda s, f: _early_stop(state, s, f)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _run_loop(main())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            os.rmdir(private)
        except OSError:
            pass
    router = state.get("router")
    server = state.get("server")
    cut = f" ({server.aborted} ended early by the stop)" if server is not None and server.aborted else ""
    say(f"stopped after {router.requests if router else 0} request(s){cut}")
    return 0


async def _autoload(catalog: Catalog, pool: Pool, name: str, say: Callable[[str], None]) -> None:
    """Load ``name`` at start, as llama-server's router autoloads; a failure is said, and its requests get it."""
    try:
        await pool.load(await catalog.find(name))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # LoadFailed, DoesNotFit, Busy, a name gone since the start: the server serves the others
        say(f"{name} was not loaded at start: {exc}")


class _RouterServer(Server):
    """serve's stopping rules; the abort is the children's, and the pool knows the
    router is closing (children that end now are not reported as failures). The
    tool calls in flight end at the first signal: they are no model's answer to
    finish, and an MCP call may wait minutes on its server."""

    def __init__(self, config: uvicorn.Config, pool: Pool, gate: ToolsGate) -> None:
        super().__init__(config, lambda reason: pool.abort())
        self.pool, self.gate = pool, gate

    def handle_exit(self, sig, frame) -> None:
        self.pool.closing = True
        self.gate.abort()
        super().handle_exit(sig, frame)


def _early_stop(state: dict, sig, frame) -> None:
    """A signal before uvicorn installs its handlers (or after): stop as it would."""
    server = state.get("server")
    if server is not None:
        server.handle_exit(sig, frame)
    else:
        raise KeyboardInterrupt


def _run_loop(main) -> None:
    """On uvloop where it is installed, as serve runs (``serve.lifecycle``: the event loop
    shares the cores with the models, and every proxied token is two socket writes on it)."""
    try:
        import uvloop  # lazy: not on Windows
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def _count(router: Router) -> None:
    router.requests += 1  # a /tools request, answered before the router: in its count all the same


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host
