"""The server's life: answering while the model loads, and stopping cleanly.

- The socket is bound and served before the model loads (in a thread), and every
  request meanwhile gets llama-server's 503 "Loading model", so a client polling
  ``/health`` sees the server come up instead of a refused connection followed
  by a request that blocks.
- When the model is lost for good (an RPC worker died: llama.cpp holds the
  aborting thread and the dead connection inside the process), every request
  gets 503 naming the cause; once the workers answer again, the process execs a
  fresh ``serve`` that inherits the listening socket (``SOCKET_FD_ENV``), so
  clients queue on it instead of being refused, and loads the model again.
- SIGINT or SIGTERM stops accepting and lets running requests finish, for up to
  ``GRACE_S``; a second signal, or the end of the grace period, ends what is left
  with an error event (a stream) or a 500 (a plain request), never a cut
  connection and a traceback, and the exit summary counts every request the app
  received, answered or not.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

import uvicorn
from starlette.responses import JSONResponse

from localllm.errors import InputError
from localllm.plan.workers import Endpoint, probe_all
from localllm.serve.accept import MAX_HEAD_BYTES, bounded

GRACE_S = 30.0
FLUSH_S = 3.0  # after aborting, how long the ended requests get to send their last bytes

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
SOCKET_FD_ENV = "LOCALLLM_SERVE_FD"  # the listening socket handed to the serve that replaces this one


class Switch:
    """ASGI app: 503 "Loading model" (llama-server's body) until ``app`` is set;
    counts the requests it receives."""

    def __init__(self) -> None:
        self.app: Callable | None = None
        self.requests = 0
        self.lost: str | None = None  # why the model is gone for good, if it is
        self.handover_fds: list[int] = []  # set when a fresh serve is to take the sockets over
        self.stopped = False  # the server has stopped: a load that ends now must not start serving
        self.stop: Callable[[], None] = lambda: None  # set by serve(): stop serving, as a signal would

    def gone(self, message: str) -> None:
        """The model can no longer be used (llama.cpp holds it): 503 from now on."""
        self.lost = message
        self.app = JSONResponse({"error": {"code": 503, "message": message, "type": "unavailable_error"}}, status_code=503)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.requests += 1
        app = self.app
        if app is not None:
            await app(scope, receive, send)
        elif scope["type"] == "http":
            await JSONResponse(LOADING, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)


class Server(uvicorn.Server):
    """uvicorn's server, stopping on our terms: the first signal drains, the second
    (or the grace period's end) calls ``abort(reason)`` to end the running requests
    with an error, waits up to ``FLUSH_S`` for them to send it, then stops."""

    def __init__(self, config: uvicorn.Config, abort: Callable[[str], int]) -> None:
        super().__init__(config)
        self.abort = abort
        self.hurry = False
        self.signalled = False
        self.aborted = 0

    def handle_exit(self, sig, frame) -> None:
        # Not uvicorn's: it would cut the running requests on a second SIGINT, and
        # raise the signals again once stopped, as tracebacks.
        if self.should_exit:
            self.hurry = True
        self.should_exit = self.signalled = True
        wake = getattr(self, "_wake", None)
        if wake is not None:
            wake()

    async def main_loop(self) -> None:
        """uvicorn's loop of 0.1 s ticks, woken at once by a signal: a router's
        model switch waits for the old model's process to stop (a tick was half
        of an idle serve's 0.1 s from SIGINT to its shutdown, on average)."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._wake: Callable[[], object] | None = lambda: loop.call_soon_threadsafe(event.set)  # from a signal handler: the loop's wake-up pipe
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            try:
                await asyncio.wait_for(event.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
            event.clear()
            should_exit = await self.on_tick(counter)
        self._wake = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        watch = asyncio.create_task(self._watch())
        try:
            await super().shutdown(sockets)
        finally:
            watch.cancel()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE_S
        while not self.hurry and loop.time() < deadline:
            await asyncio.sleep(0.05)
        why = "a second signal" if self.hurry else f"the {GRACE_S:g} s grace period ended"
        self.aborted = self.abort(f"the server is stopping ({why})")
        deadline = loop.time() + FLUSH_S
        while self.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self.force_exit = True


def _run(main) -> None:
    """Run the server's coroutine on uvloop where it is installed (not on Windows),
    else on asyncio's own loop. The event loop shares the cores with llama.cpp's
    decode threads, and every streamed token is one socket write on it: uvloop
    took its CPU from 0.111 to 0.101 ms a token at 8 clients on 2 threads here
    (0.075 with protocol.Shaper's chunk template too)."""
    try:
        import uvloop  # lazy: only serve runs an event loop of its own; uvloop is not on Windows
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def serve(switch: Switch, socks: list[socket.socket], load: Callable[[], None], abort: Callable[[str], int],
          header_timeout: float | None = None) -> Server:
    """Serve ``switch`` on ``socks`` (one per --host) while ``load()`` runs in a thread (it sets
    ``switch.app``); return once stopped: by a signal, or by ``load`` failing
    (its exception re-raised here). ``header_timeout``: --timeout (accept.bounded)."""
    # Connections are capped by the protocol (per client, idle ones closed first);
    # uvicorn's limit_concurrency would count idle sockets and answer 503 to all.
    config = uvicorn.Config(switch, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=None,
                            http=bounded(header_timeout), limit_concurrency=None, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                            server_header=False, date_header=False)
    server = Server(config, abort)
    switch.stop = lambda: setattr(server, "should_exit", True)
    failed: list[BaseException] = []

    def loader() -> None:
        try:
            load()
        except BaseException as exc:  # shown by the caller, once the server has stopped
            failed.append(exc)
            server.should_exit = True

    # Ours until uvicorn installs the same (and after it restores them): a signal
    # before the loop runs stops the server too, and SIGTERM never ends the process
    # before the model is freed.
    # Only the main thread may set them: a server a program runs in a thread of its own (``serve.Server.start``) is stopped by ``switch.stop``.
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        thread = threading.Thread(target=loader, name="localllm-load", daemon=True)
        thread.start()
        _run(server.serve(sockets=socks))
        switch.stopped = True
        if thread.is_alive() and switch.lost is None and server.signalled:  # else a stop could look like a hang
            print("localllm: stopping once the model has loaded (llama.cpp cannot be interrupted mid-load)", file=sys.stderr, flush=True)
        while thread.is_alive() and switch.lost is None:  # a signal during the load: llama.cpp cannot be interrupted mid-load
            thread.join(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise failed[0]
    return server


def inherited_sockets() -> list[socket.socket]:
    """The listening sockets a serve that exec'd this one handed over (one per
    --host), if any: the environment holds their descriptors, comma-separated."""
    fds = os.environ.pop(SOCKET_FD_ENV, "").split(",")
    return [socket.socket(fileno=int(fd)) for fd in fds] if all(fd.isdigit() for fd in fds) else []


def hand_over(switch: Switch, socks: list[socket.socket]) -> bool:
    """Stop serving so that ``exec_fresh`` can replace this process (from any
    thread); False when this process was not started as ``localllm ... serve``
    (the library or a test in-process), which stays as it is."""
    if "serve" not in sys.argv[1:]:
        return False
    fds = [os.dup(sock.fileno()) for sock in socks]  # uvicorn closes ``socks`` as it stops
    for fd in fds:
        os.set_inheritable(fd, True)
    switch.handover_fds = fds
    switch.stop()
    return True


def exec_fresh(fds: list[int]) -> NoReturn:
    """Replace this process (and the threads llama.cpp holds in it) with the same
    ``localllm serve`` command line, which takes the sockets ``fds`` over."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[SOCKET_FD_ENV] = ",".join(map(str, fds))
    os.execv(sys.executable, [sys.executable, "-m", "localllm", *sys.argv[1:]])


def recover_lost_workers(switch: Switch, socks: list[socket.socket], abort: Callable[[str], int], endpoints: Sequence[Endpoint]) -> None:
    """``--rpc``: when a worker dies, end the running requests with an error and
    answer 503 (``switch.gone``); once every worker answers again, hand the
    socket over to a fresh serve (``hand_over``, then ``exec_fresh``)."""
    from localllm.engine import rpc  # lazy: loads llama.cpp's libraries, for --rpc only

    def worker_gone(line: str) -> None:
        # on llama.cpp's aborting thread, which it then holds for good, as the engine's
        ended = abort(f"the model is gone: {line}")
        switch.gone(f"the model is gone: {line}; it loads again once the worker is back")
        print(f"localllm: error: {line}: {ended} request(s) ended with an error; 503 until the workers answer again", file=sys.stderr, flush=True)
        threading.Thread(target=when_back, daemon=True).start()

    def when_back() -> None:
        while True:
            try:
                probe_all(list(endpoints), timeout=2)
            except InputError:
                time.sleep(2)
                continue
            hand_over(switch, socks)
            return

    rpc.keep_alive_on_abort(worker_gone)
