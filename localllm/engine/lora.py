"""LoRA adapters on llama.cpp: load them for a model, set them on a context with scales, free them.

The bindings of llama-cpp-python 0.3.36: ``llama_adapter_lora_init(model, path)``
loads one (NULL on failure, with llama.cpp's reason in its log),
``llama_set_adapters_lora(ctx, adapters, n, scales)`` sets the whole list on a
context (llama-context.cpp keeps only the non-zero scales, and does nothing
when the list is the one already set), ``(ctx, None, 0, None)`` clears it, and
``llama_adapter_lora_free`` frees one (it unregisters it from its model first,
so freeing before the model is safe; the model frees the rest itself).

Every file is read and checked against the model's header first
(``modelfile.lora.read_checked``), so an adapter for another architecture or
embedding size, a missing, foreign or damaged file is one line naming the
cause, not llama.cpp's "model arch and LoRA arch mismatch".
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from localllm.engine.llamalog import ROUTER
from localllm.errors import EngineError
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.modelfile.lora import AdapterInfo, AdapterSpec, read_checked

__all__ = ["AdapterSpec", "Adapters", "clear"]


class Adapters:
    """The adapters loaded for one model, in the order given (their ids), with
    the scales they start with. Used from one thread (the engine's)."""

    def __init__(self, model: object, header: GGUFHeader, specs: Sequence[AdapterSpec]) -> None:
        """Check every file first (nothing is loaded when one is wrong), then
        load each; a file llama.cpp still refuses frees the ones loaded and
        raises ``EngineError`` quoting llama.cpp's first error line."""
        self.infos: list[AdapterInfo] = [read_checked(s.path, header) for s in specs]
        self.scales: list[float] = [float(s.scale) for s in specs]
        self._ptrs: list[Any] = []  # llama_adapter_lora_p_ctypes pointers
        self._applied: dict[int, tuple[float, ...] | None] = {}  # id(ctx) -> the scales last set on it
        for spec in specs:
            mark = ROUTER.mark()
            ptr = llama_cpp.llama_adapter_lora_init(model, str(spec.path).encode("utf-8"))
            if not ptr:
                self.free()
                raise EngineError(f"llama.cpp could not load the LoRA adapter {spec.path}: "
                                  f"{ROUTER.first_error_since(mark) or 'unknown reason'}")
            self._ptrs.append(ptr)

    def __len__(self) -> int:
        return len(self._ptrs)

    @property
    def paths(self) -> list[Path]:
        return [i.path for i in self.infos]

    def apply(self, ctx: object, scales: Sequence[float] | None = None) -> None:
        """Set the adapters on ``ctx`` with ``scales`` (by id; default the
        adapters' own). Zero scales are left out, and none left clears the
        context, so scale 0 is exactly no adapter. Skipped when ``ctx`` already
        has these scales (a changed set makes llama.cpp re-reserve its graph)."""
        want = tuple(float(s) for s in (self.scales if scales is None else scales))
        if len(want) != len(self._ptrs):
            raise EngineError(f"{len(want)} scales for {len(self._ptrs)} LoRA adapters")
        key = id(ctx)
        if self._applied.get(key) == want:
            return
        on = [(p, s) for p, s in zip(self._ptrs, want) if s != 0.0]
        if on:
            arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(on))(*(p for p, _ in on))
            sc = (ctypes.c_float * len(on))(*(s for _, s in on))
            rc = llama_cpp.llama_set_adapters_lora(ctx, arr, len(on), sc)
        else:
            rc = llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        if rc != 0:
            raise EngineError(f"llama.cpp could not set the LoRA adapters ({rc}): {ROUTER.last_error() or 'no reason given'}")
        self._applied[key] = want

    def forget(self, ctx: object) -> None:
        """``ctx`` is being freed: what was set on it no longer counts."""
        self._applied.pop(id(ctx), None)

    def free(self) -> None:
        """Free the adapters (before their model; a context that used them must not decode again)."""
        for ptr in self._ptrs:
            llama_cpp.llama_adapter_lora_free(ptr)
        self._ptrs = []
        self._applied.clear()


def clear(ctx: object) -> None:
    """No adapter on ``ctx`` (llama_set_adapters_lora with an empty list)."""
    llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
