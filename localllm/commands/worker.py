"""``localllm worker``: serve this machine's devices to another machine's
``--rpc``, through llama.cpp's own RPC server (no separate binary).

The C server (``ggml_backend_rpc_start_server``) blocks forever inside one
ctypes call, where Python cannot deliver Ctrl+C; so it runs on a daemon thread
and the main thread waits for the signal, then exits at once with 130
(``os._exit``: the server thread never returns, and a normal interpreter
shutdown would wait on nothing useful).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localllm import flags
from localllm.errors import EXIT_INTERRUPTED, InputError
from localllm.util.units import format_size

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.plan.workers import Endpoint


def register(sub: Subparsers) -> None:
    p = sub.add_parser("worker", help="serve this machine's devices to another machine's --rpc (llama.cpp's RPC server)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="IPv4 address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_worker_port, default=50052, metavar="N", help="TCP port (default: 50052)")
    p.add_argument("--threads", type=flags.int_at_least(1, "--threads"), default=None, metavar="N",
                   help="CPU threads for a CPU device (default: physical cores)")
    p.add_argument("--device", type=lambda t: [d for d in t.split(",") if d], default=None, metavar="DEV[,DEV]",
        help="devices to serve, e.g. CUDA0 or CPU (default: the GPUs, else the CPU)")
    p.add_argument("--i-understand-this-is-open", action="store_true",

                       help="allow a --host other than loopback: the RPC protocol has no authentication, anyone who reaches the "
                       "port can use this machine's devices and memory")
    p.add_argument("--json", action="store_true", help="one JSON line on stdout when the worker is ready (endpoint, devices)")


def _worker_port(text: str) -> int:
    """A worker's port: llama.cpp's RPC server needs a fixed one (clients name it)."""
    value = flags.int_at_least(1, "--port")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"--port must be at most 65535, got {value}")
    return value


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    threads: int | None
    device: tuple[str, ...]
    i_understand_this_is_open: bool
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(host=ns.host, port=ns.port, threads=ns.threads, device=tuple(ns.device or ()),
                   i_understand_this_is_open=ns.i_understand_this_is_open, json=ns.json)


OPEN_WARNING = (
    "WARNING: llama.cpp's RPC protocol has no authentication and no encryption. Anyone who can reach {ep} "
    "can run computations on this machine's devices and read or write their memory buffers. "
    "Serve only on a network you trust, and stop the worker when you are done."
)


def _say(msg: str) -> None:
    print(f"localllm: {msg}", file=sys.stderr, flush=True)


def _port_free(ep: Endpoint) -> None:
    """Fail early, with the fix, when the port is taken (the C server only prints
    'Failed to create server socket')."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ep.host, ep.port))
    except OSError as exc:
        raise InputError(f"cannot listen on {ep}: {exc.strerror or exc} (another worker there? try --port {ep.port + 1})") from None
    finally:
        s.close()


def run(args: argparse.Namespace) -> int:
    opts = Options.from_args(args)
    # lazy: loads gguf, llama.cpp, numpy (~169 ms here), which worker does not load at import
    from localllm.engine import default_threads, rpc
    from localllm.plan.workers import Endpoint, check_bind_host, probe  # lazy: the RPC client (socket, ipaddress: ~6 ms), which --help does not need

    host = check_bind_host(opts.host, opts.i_understand_this_is_open)
    ep = Endpoint(host, opts.port)
    devices = rpc.server_devices(list(opts.device))
    threads = opts.threads or default_threads()
    _port_free(ep)
    if host != "127.0.0.1" and not host.startswith("127."):
        _say(OPEN_WARNING.format(ep=ep))
    names = [f"{rpc.dev_name(d)} ({rpc.dev_description(d)}, {format_size(rpc.dev_memory(d)[0], 'GiB', 1)} free)" for d in devices]
    # llama.cpp's server prints its banner and a line per client on C's stdout:
    # send that to stderr, so that stdout carries only our --json line.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    done = threading.Event()

    def serve() -> None:
        try:
            rpc.start_server(ep, devices, threads)
        finally:
            done.set()

    # SIGTERM ends the worker like Ctrl+C does (exit 130 is for SIGINT; 0 for TERM).
    def _on_term(*_: object) -> None:
        _say("worker stopped")
        os._exit(0)

    signal.signal(signal.SIGTERM, _on_term)
    thread = threading.Thread(target=serve, name="rpc-server", daemon=True)
    try:
        thread.start()
        # Ready when it answers a HELLO (it serves one client at a time, so this
        # probe is a client like any other and is gone before the first real one).
        deadline = time.monotonic() + 30
        while not done.is_set():
            try:
                probe(Endpoint("127.0.0.1" if host == "0.0.0.0" else host, ep.port), timeout=1.0)
                break
            except InputError:
                if time.monotonic() > deadline:
                    raise InputError(f"the worker did not start listening on {ep} within 30 s") from None
                time.sleep(0.05)
        if done.is_set():
            raise InputError(f"llama.cpp's RPC server could not listen on {ep} (see its message above)")
        _say(f"worker ready on {ep}, serving {'; '.join(names)} with {threads} threads")
        if opts.json:
            devs = [{"name": rpc.dev_name(d), "description": rpc.dev_description(d),
                     "free_bytes": rpc.dev_memory(d)[0], "total_bytes": rpc.dev_memory(d)[1]} for d in devices]
            out.write(json.dumps({"endpoint": str(ep), "threads": threads, "devices": devs}) + "\n")
            out.flush()
        _say(f"on the other machine: localllm run --rpc {'THIS-MACHINE-IP' if host == '0.0.0.0' else host}:{ep.port} ...   (Ctrl+C stops the worker)")
        while not done.wait(0.5):
            pass
        raise InputError(f"llama.cpp's RPC server on {ep} stopped")
    except KeyboardInterrupt:
        _say("worker stopped")
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
