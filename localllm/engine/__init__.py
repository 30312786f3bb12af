"""The llama.cpp adapter: the only code that imports ``llama_cpp``. Importing it
checks the installed llama-cpp-python (``native.missing_struct_fields``) before
anything calls into it.

One module per job, so a change to one (say, how a context shifts) is made in
one small file:

- ``native``     loading llama_cpp, the struct-field check, the log router, machine facts
- ``model``      LoadConfig -> llama.cpp params; the model and context handle, decode
- ``tokenizer``  text <-> tokens, BOS/EOG, rendering a chat
- ``template``   which chat template (the model's, a file, a built-in)
- ``sampler``    the sampler chain for a SamplingConfig
- ``kvcache``    the KV cache and its token mirror: reset, truncate, shift, state files
- ``statefile``  the checked state-file format (pure Python)
- ``generator``  timed generation, returning a ``Generation``
- ``scorer``     logits at every position: speculative verification, quality
- ``quantize``   llama.cpp's quantizer
- ``llama``      ``LlamaCppBackend``, the ``Engine`` (``localllm.engine_api``) built from them
- ``chat_template`` a Jinja chat template rendered in a sandbox, with limits
- ``batch``      several sequences in one context, for ``serve``
- ``dryrun``     llama.cpp's dry run of a load (no_alloc), run by ``plan.referee``
- ``rpc``        llama.cpp's RPC backend through ctypes: workers and devices
- ``lora``       LoRA adapters: loaded for a model (headers checked first), set on a context with scales
- ``llamalog``   llama.cpp's log, routed into Python logging (pure Python)
- ``threadctl``  the thread counts set before each decode (``llama_set_n_threads``), as ``localllm.threads`` chooses them

The names other modules import from ``localllm.engine`` are re-exported here, each
loaded on first use (PEP 562 ``__getattr__``): the dry run's child needs ``model``
alone, and the whole engine (the backend, its sampler, numpy) took 0.33 s of that
child's 0.4 s start here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# First: native's import-time check (missing_struct_fields) runs before any other part loads.
from localllm.engine import native  # noqa: F401

# isort: split
from localllm.engine.native import (
    MAX_CTX,
    MAX_THREADS,
    default_threads,
    gpu_offload_supported,
    install_log_router,
    max_threads,
    missing_struct_fields,
    system_info,
)

if TYPE_CHECKING:
    from localllm.engine.kvcache import KVCache
    from localllm.engine.llama import LlamaCppBackend
    from localllm.engine.llamalog import ROUTER
    from localllm.engine.model import ModelHandle, check_config, llama_params, load_model_and_context
    from localllm.engine.quantize import QUANT_TYPES, quantize_model
    from localllm.engine.statefile import STATE_MAGIC, STATE_VERSION, StateFileError, pack_state, unpack_state
    from localllm.engine.template import builtin_templates
    from localllm.engine.tokenizer import Tokenizer

# name -> the module that defines it
_LAZY = {
    "KVCache": "kvcache", "LlamaCppBackend": "llama", "ROUTER": "llamalog", "ModelHandle": "model", "check_config": "model",
    "llama_params": "model", "load_model_and_context": "model", "QUANT_TYPES": "quantize", "quantize_model": "quantize",
    "STATE_MAGIC": "statefile", "STATE_VERSION": "statefile", "StateFileError": "statefile", "pack_state": "statefile",
    "unpack_state": "statefile", "builtin_templates": "template", "Tokenizer": "tokenizer",
}

__all__ = [
    "KVCache", "LlamaCppBackend", "MAX_CTX", "MAX_THREADS", "ModelHandle", "QUANT_TYPES", "ROUTER", "STATE_MAGIC",
    "STATE_VERSION", "StateFileError", "Tokenizer", "builtin_templates", "check_config",
    "default_threads", "gpu_offload_supported", "install_log_router", "llama_params", "load_model_and_context",
    "max_threads", "missing_struct_fields", "pack_state", "quantize_model", "system_info", "unpack_state",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'localllm.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"localllm.engine.{module}"), name)
    globals()[name] = value
    return value
