"""llama-cpp-python's ctypes bindings without its high-level half (``util.lean_import``:
190 ms of every model-loading process's start here, code the engine never calls)."""

from __future__ import annotations

from localllm.util import lean_import


def install() -> None:
    """Before the first ``import llama_cpp``: the package with ``llama_cpp.llama_cpp``'s names."""
    lean_import.install("llama_cpp", ("llama_cpp",))
