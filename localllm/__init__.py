"""localllm: run, measure and shrink LLMs on your own laptop, offline.

The library API (``localllm.api``)::

    import localllm

    with localllm.load("smollm2") as model:
        print(model.chat("Hello!", max_tokens=32).text())

Its names are loaded on first use (PEP 562 ``__getattr__``): importing the API
reads numpy and gguf (~150 ms here) and ``load`` llama.cpp (~190 ms), which
``localllm --help`` and ``import localllm`` for the version need not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    "load": "localllm.api", "fit": "localllm.api", "resolve": "localllm.api", "quantize_model": "localllm.api",
    "Model": "localllm.api", "Response": "localllm.api", "Conversation": "localllm.api",
    "LoadConfig": "localllm.engine_api", "SamplingConfig": "localllm.engine_api", "GenerationStats": "localllm.engine_api",
    "Engine": "localllm.engine_api", "Generation": "localllm.engine_api",
    "Fit": "localllm.plan.fitting",
    "LocalLLMError": "localllm.errors", "InputError": "localllm.errors", "UsageError": "localllm.errors",
    "EngineError": "localllm.errors",
}

__all__ = [
    "Conversation", "Engine", "EngineError", "Fit", "Generation", "GenerationStats", "InputError", "LoadConfig",
    "LocalLLMError", "Model", "Response", "SamplingConfig", "UsageError", "__version__", "fit", "load",
    "quantize_model", "resolve",
]

if TYPE_CHECKING:
    from localllm.api import Conversation, Model, Response, fit, load, quantize_model, resolve
    from localllm.engine_api import Engine, Generation, GenerationStats, LoadConfig, SamplingConfig
    from localllm.errors import EngineError, InputError, LocalLLMError, UsageError
    from localllm.plan.fitting import Fit


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib  # lazy: the API is loaded on first use, see above

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'localllm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
