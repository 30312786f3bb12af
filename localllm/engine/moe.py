"""Expert weights in RAM: llama.cpp's ``--cpu-moe`` / ``--n-cpu-moe`` through
``llama_model_params.tensor_buft_overrides``.

llama-cpp-python declares that field as a bare pointer (``c_void_p``), so the
NULL-terminated array of ``llama_model_tensor_buft_override {const char *
pattern; ggml_backend_buffer_type_t buft;}`` (include/llama.h) is built here,
with llama.cpp's own patterns (``llama_rules.cpu_moe_patterns``, from
common/common.h) and the CPU device's buffer type. llama.cpp keeps the pattern
pointers and reads them while it loads, so the array and its strings are
returned for the caller to keep alive through the load.
"""

from __future__ import annotations

import ctypes
from typing import Any

from localllm.engine import rpc
from localllm.engine_api import LoadConfig
from localllm.engine_api.llama_rules import cpu_moe_patterns


class TensorBuftOverride(ctypes.Structure):
    """include/llama.h ``struct llama_model_tensor_buft_override``."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def set_overrides(mparams: Any, config: LoadConfig) -> list[object]:
    """Point ``mparams.tensor_buft_overrides`` at the CPU overrides ``config``
    asks for (none: left NULL). Returns what must outlive the load."""
    patterns = cpu_moe_patterns(config.n_cpu_moe)
    if not patterns:
        return []
    buft = rpc.cpu_buffer_type()
    strings = [ctypes.create_string_buffer(p.encode("ascii")) for p in patterns]
    arr = (TensorBuftOverride * (len(strings) + 1))(
        *(TensorBuftOverride(ctypes.cast(s, ctypes.c_char_p), buft) for s in strings), TensorBuftOverride(None, None)
    )
    mparams.tensor_buft_overrides = ctypes.addressof(arr)
    return [arr, strings]
