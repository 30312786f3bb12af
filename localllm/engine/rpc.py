"""llama.cpp's RPC backend through ctypes: part of the engine adapter.

Like ``engine``, this module may touch llama.cpp (it imports ``llama_cpp`` to
find its shared libraries and calls ``libggml`` with ctypes); nothing outside
the engine side imports it, and only lazily. llama-cpp-python binds ``libllama``
but not the ggml backend registry, so the few calls llama.cpp's own tools make
are made here:

- the client side, as ``common/arg.cpp`` ``add_rpc_devices`` does:
  ``ggml_backend_reg_by_name("RPC")``, then
  ``ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server")``, called
  with ``"host:port"``; the devices of the registry it returns are handed to
  ``llama_model_params.devices``. They are *not* ``ggml_backend_register``-ed:
  a registered device would join every later load in this process, and a gone
  worker would then abort it;
- the server side, as ``tools/rpc/rpc-server.cpp`` does:
  ``ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices)``
  (ggml-rpc.h of the vendored llama.cpp; it blocks forever).

llama.cpp aborts the process when a worker stops answering (ggml-rpc.cpp
``RPC_STATUS_ASSERT``: "Remote RPC server crashed or returned malformed
response"). ``on_abort`` installs ggml's abort callback so that the CLI can say
one line, save what it must and exit 1 instead of dumping a backtrace.
``keep_alive_on_abort`` is for a long-lived UI (the cockpit): the process goes
on without the model (llama.cpp cannot be unwound: the aborting thread is held).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from localllm.engine.native import install_log_router
from localllm.errors import EngineError, UsageError
from localllm.plan.workers import Endpoint, probe_all

_lock = threading.Lock()
_libs: list[ctypes.CDLL] = []
_abort_cb = None  # keep a reference: C holds the pointer
_abort_hooks: list[Callable[[str], str | None]] = []
_keep_alive_hooks: list[Callable[[str], None]] = []
_parked = threading.Event()  # a thread is held in the abort callback for good

DEV_TYPE_CPU, DEV_TYPE_GPU, DEV_TYPE_IGPU, DEV_TYPE_ACCEL = 0, 1, 2, 3  # ggml-backend.h enum ggml_backend_dev_type


def _lib_dir() -> Path:
    import llama_cpp  # noqa: F401  (loads libllama and with it libggml)

    return Path(llama_cpp.__file__).parent / "lib"


def _fn(name: str, restype, *argtypes):
    """A function from libggml or libggml-base (the backend registry is split
    across the two), with its C signature."""
    with _lock:
        if not _libs:
            d = _lib_dir()
            for stem in ("ggml", "ggml-base"):
                for path in (d / f"lib{stem}.so", d / f"lib{stem}.dylib", d / f"{stem}.dll"):
                    if path.exists():
                        _libs.append(ctypes.CDLL(str(path), mode=getattr(os, "RTLD_GLOBAL", 0)))
                        break
    for lib in _libs:
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = restype
            f.argtypes = list(argtypes)
            return f
    raise EngineError(f"this llama.cpp build has no {name}: reinstall with scripts/install.sh (it builds the RPC backend)")


def _rpc_reg() -> int:

    install_log_router()
    reg = _fn("ggml_backend_reg_by_name", ctypes.c_void_p, ctypes.c_char_p)(b"RPC")
    if not reg:
        raise EngineError("this llama.cpp build has no RPC backend: reinstall with scripts/install.sh (it passes -DGGML_RPC=ON)")
    return reg


def _proc(reg: int, name: str, proto):
    addr = _fn("ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(reg, name.encode())
    if not addr:
        raise EngineError(f"llama.cpp's RPC backend has no {name}")
    return proto(addr)


def dev_name(dev: int) -> str:
    return _fn("ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)(dev).decode()


def dev_description(dev: int) -> str:
    return _fn("ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)(dev).decode()


def dev_memory(dev: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _fn("ggml_backend_dev_memory", None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))(
        dev, ctypes.byref(free), ctypes.byref(total)
    )
    return free.value, total.value


def dev_type(dev: int) -> int:
    return _fn("ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)(dev)


def cpu_buffer_type() -> int:
    """The CPU device's buffer type: the pointer llama.cpp's loader compares with
    ``ggml_backend_cpu_buffer_type()`` to honour a tensor override to the CPU
    (ggml-cpu.cpp returns that same object for its device)."""
    _rpc_reg()  # initializes the backend registry
    dev = _fn("ggml_backend_dev_by_type", ctypes.c_void_p, ctypes.c_int)(DEV_TYPE_CPU)
    buft = _fn("ggml_backend_dev_buffer_type", ctypes.c_void_p, ctypes.c_void_p)(dev) if dev else None
    if not buft:
        raise EngineError("this llama.cpp build has no CPU device")
    return buft


def all_devices() -> list[int]:
    """Every device registered in this process (CPU included), in registry order."""
    _rpc_reg()  # initializes the backend
    n = _fn("ggml_backend_dev_count", ctypes.c_size_t)()
    get = _fn("ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    return [get(i) for i in range(n)]


def local_gpus() -> list[int]:
    """This machine's GPUs as llama.cpp picks them by default (llama.cpp
    ``llama_prepare_model_devices``): discrete GPUs; integrated ones only when there
    is no discrete one."""
    devs = all_devices()
    gpus = [d for d in devs if dev_type(d) == DEV_TYPE_GPU]
    return gpus or [d for d in devs if dev_type(d) == DEV_TYPE_IGPU][:1]


def add_servers(endpoints: Sequence[Endpoint]) -> list[int]:
    """The devices of each worker, in order, ready for ``llama_model_params.devices``.
    Every worker is probed first (with a timeout): llama.cpp itself would abort
    on one that is down."""
    probe_all(list(endpoints))
    reg = _rpc_reg()
    add = _proc(reg, "ggml_backend_rpc_add_server", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p))
    count = _fn("ggml_backend_reg_dev_count", ctypes.c_size_t, ctypes.c_void_p)
    get = _fn("ggml_backend_reg_dev_get", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    devs: list[int] = []
    for ep in endpoints:
        r = add(str(ep).encode())
        if not r:
            raise EngineError(f"worker {ep} serves no devices")
        devs.extend(get(r, i) for i in range(count(r)))
    return devs


def server_devices(names: Sequence[str]) -> list[int]:
    """Devices a worker serves: the named ones, else (as rpc-server does) every
    non-CPU device, else the CPU."""
    devs = all_devices()
    if names:
        by_name = {dev_name(d): d for d in devs}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise UsageError(f"no device named {', '.join(missing)} here: choose from {', '.join(by_name)}")
        return [by_name[n] for n in names]
    accel = [d for d in devs if dev_type(d) != DEV_TYPE_CPU]
    return accel or [d for d in devs if dev_type(d) == DEV_TYPE_CPU]


def start_server(endpoint: Endpoint, devices: Sequence[int], n_threads: int, cache_dir: str | None = None) -> None:
    """Serve ``devices`` on ``endpoint``: blocks for as long as the server runs
    (forever, unless it cannot listen; then it returns)."""
    reg = _rpc_reg()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
    start = _proc(reg, "ggml_backend_rpc_start_server", proto)
    arr = (ctypes.c_void_p * len(devices))(*devices)
    start(str(endpoint).encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), arr)


def on_abort(hook: Callable[[str], str | None] | None = None) -> None:
    """When llama.cpp aborts (a worker gone mid-generation): end the reply in
    progress, run the hooks (each may save something and return a few words to
    add, e.g. where it saved the chat), print one line and exit 1. The hooks run
    on the thread that aborted (llama.cpp's RPC dispatcher); they must be quick."""
    global _abort_cb
    with _lock:
        if hook is not None:
            _abort_hooks.append(hook)
        if _abort_cb is not None:
            return

        @ctypes.CFUNCTYPE(None, ctypes.c_char_p)
        def _cb(message: bytes | None) -> None:
            text = (message or b"").decode("utf-8", "replace").strip().splitlines()
            detail = text[0].split(": ", 1)[-1] if text else "no reason given"
            if _keep_alive_hooks:
                _hold(f"{'a worker stopped answering' if 'RPC' in detail else 'llama.cpp aborted'} ({detail})")
            extra = []
            try:
                for h in list(_abort_hooks):
                    try:
                        said = h(detail)
                    except Exception as exc:  # the line must still come out
                        said = f"could not save: {exc}"
                    if said:
                        extra.append(said)
                sys.stdout.write("\n")
                sys.stdout.flush()
                what = "a worker stopped answering" if "RPC" in detail else "llama.cpp aborted"
                sys.stderr.write(f"localllm: error: {what} ({detail})" + "".join(f"; {e}" for e in extra) + "\n")
                sys.stderr.flush()
            finally:
                os._exit(1)

        _abort_cb = _cb
    _fn("ggml_set_abort_callback", ctypes.c_void_p, ctypes.c_void_p)(ctypes.cast(_abort_cb, ctypes.c_void_p))


def keep_alive_on_abort(hook: Callable[[str], None]) -> None:
    """For a long-lived UI (the cockpit): when llama.cpp aborts (a worker gone
    mid-reply), call ``hook`` with one line saying why, and keep the process.
    ggml_abort calls abort() once its callback returns, and nothing can unwind
    llama.cpp's frames from Python, so the aborting thread (llama.cpp's RPC
    dispatcher; the thread that called into llama.cpp then waits on it for
    good) is held here instead: that model can no longer be used or freed, the
    rest of the process goes on. ``parked`` tells the exit path."""
    with _lock:
        _keep_alive_hooks.append(hook)
    on_abort()


def drop_keep_alive(hook: Callable[[str], None]) -> None:
    """Undo ``keep_alive_on_abort`` (the UI is closing)."""
    with _lock:
        if hook in _keep_alive_hooks:
            _keep_alive_hooks.remove(hook)


def parked() -> bool:
    """A thread is held since llama.cpp aborted: the interpreter would wait for
    it at exit for good, so the process must leave with ``os._exit``."""
    return _parked.is_set()


def _hold(text: str) -> None:
    for h in list(_keep_alive_hooks):
        try:
            h(text)
        except Exception:  # noqa: BLE001 - the thread must be held whatever a hook does
            pass
    _parked.set()
    threading.Event().wait()  # never set: returning would let ggml_abort call abort()


def has_local_gpu() -> bool:
    """Whether this build of llama.cpp sees a GPU on this machine."""
    return bool(local_gpus())
