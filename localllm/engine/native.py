"""The one place that loads ``llama_cpp`` and checks it before anything uses it.

Every other module of the engine imports ``llama_cpp`` after this one has run,
so the struct-field check below guards them all. It also routes llama.cpp's
log into ``logging`` and holds the machine facts the loader needs (threads,
offload support, the build's feature line).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path

from localllm.util import lean_import

# Before the first ``import llama_cpp``: its ctypes bindings alone, not its high-level
# ``Llama`` (190 ms of every model-loading process's start here; util.lean_import).
lean_import.install("llama_cpp", ("llama_cpp",))

import llama_cpp  # noqa: E402

from localllm.engine.llamalog import ROUTER  # noqa: E402
from localllm.errors import EngineError  # noqa: E402
from localllm.plan.hardware import physical_cores  # noqa: E402

# Every struct field this package sets on llama.cpp's parameter structs. ctypes
# silently accepts an unknown attribute on a Structure (it becomes a plain
# Python attribute llama.cpp never sees), so an older or newer llama-cpp-python
# whose structs lack one would load with our settings quietly ignored: check at
# import, where the cost is one getattr per name and no I/O.
_FIELDS_SET = {
    "llama_model_params": ("n_gpu_layers", "devices", "tensor_split"),
    "llama_context_params": (
        "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "type_k", "type_v",
        "flash_attn_type", "swa_full", "n_seq_max", "kv_unified", "n_outputs_max", "no_perf",
        "n_outputs_max_per_seq", "embeddings", "pooling_type", "cb_eval",
    ),
    "llama_model_quantize_params": ("nthread", "ftype", "allow_requantize", "dry_run", "imatrix"),
}


def missing_struct_fields(module: object = llama_cpp) -> list[str]:
    """``struct.field`` names we set that this llama-cpp-python does not have."""
    missing = []
    for struct, names in _FIELDS_SET.items():
        cls = getattr(module, struct, None)
        have = {f[0] for f in getattr(cls, "_fields_", ())}
        missing += [f"{struct}.{n}" for n in names if n not in have]
    return missing


_missing = missing_struct_fields()
if _missing:  # EngineError: the CLI shows it as one line, exit 1
    raise EngineError(
        f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks {', '.join(_missing)}: "
        "localllm needs llama-cpp-python>=0.3.36 (run scripts/install.sh)"
    )

_callback = llama_cpp.llama_log_callback(ROUTER)  # keep a reference: C holds the pointer
_init_lock = threading.Lock()
_initialized = False


def install_log_router() -> None:
    """Route llama.cpp's log into ``logging`` and initialize the backend (once)."""
    global _initialized
    with _init_lock:
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
        if not _initialized:
            llama_cpp.llama_backend_init()
            _initialized = True


def default_threads() -> int:
    """llama.cpp's thread count where none is given: the physical cores this process
    may run on (localllm.plan.hardware.physical_cores, one rule for the engine, plan
    and doctor)."""
    return physical_cores()


MAX_CTX = 1 << 24  # llama.cpp keeps n_ctx in a uint32; no model is trained on more than ~10M tokens
MAX_THREADS = 512  # GGML_MAX_N_THREADS, ggml/include/ggml.h


def max_threads() -> int:
    """Threads a load may ask for: this machine's logical CPUs (and ggml's cap)."""
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type (ggml/include/ggml-backend.h)


def gpu_offload_supported() -> bool:
    """Whether this build has a GPU (or integrated GPU) device to offload to.

    Not ``llama_supports_gpu_offload()``: that is true in every build with the
    RPC backend compiled in (src/llama.cpp: ``... || llama_supports_rpc()``),
    GPU or not, and our builds have it. A worker added with ``--rpc`` shows up
    as a GPU-type device, so it counts once it is there."""
    install_log_router()
    lib = _ggml_lib()
    if lib is None:
        return bool(llama_cpp.llama_supports_gpu_offload())
    by_type = lib.ggml_backend_dev_by_type
    by_type.restype = ctypes.c_void_p
    by_type.argtypes = [ctypes.c_int]
    return any(by_type(t) for t in (_DEV_GPU, _DEV_IGPU))


def _ggml_lib() -> ctypes.CDLL | None:
    """llama-cpp-python's own libggml (already loaded by llama_cpp: same handle)."""
    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (libdir / name).exists():
            return ctypes.CDLL(str(libdir / name))
    return None


def tensor_name_fn() -> Callable[[int], bytes] | None:
    """ggml's ``ggml_get_name`` (a tensor's name, for an eval callback), or None
    where llama-cpp-python ships no libggml we can find."""
    lib = _ggml_lib()
    if lib is None:
        return None
    fn = lib.ggml_get_name
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    return fn


def system_info() -> str:
    """llama.cpp's feature line (CPU flags, backends): part of a state file's build key."""
    install_log_router()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
