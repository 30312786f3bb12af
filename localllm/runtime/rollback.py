"""Switch models without losing the one loaded: the cockpit's reload.

Two models at once may not fit, so the model loaded is closed before the new
one loads; when the new one fails (a bad file, a setting llama.cpp refuses, a
context it cannot allocate) the previous one is loaded again exactly as it was
(its config, not a new fit: the machine may have changed meanwhile), so a bad
choice costs nothing but the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.engine_api import LoadConfig
from localllm.modelfile.lora import AdapterSpec
from localllm.runtime.errors import NoImages
from localllm.runtime.loading import Loaded, load
from localllm.runtime.planning import Planned, plan
from localllm.runtime.request import LoadRequest


@dataclass(frozen=True)
class Previous:
    """The model loaded now, as it was loaded: what a failed switch comes back to."""

    engine: Any
    path: Path
    config: LoadConfig
    projector: Path | None = None  # loaded again with it (a failure is a note: the model runs text only)
    lora: tuple[AdapterSpec, ...] = ()


@dataclass
class Switched:
    """How a switch ended: the new model loaded, or why not and whether the
    previous one is loaded (never closed, or loaded again)."""

    loaded: Loaded | None
    error: Exception | None = None  # why the new model did not load
    kept: bool = False  # the previous model is loaded
    restore_error: Exception | None = None  # why loading the previous one again failed too
    projector_error: Exception | None = None  # the previous one is back, its projector not


def reload_or_restore(previous: Previous | None, request: LoadRequest | Planned,
                      engine_factory: Callable[[], Any] | None = None) -> Switched:
    """Fit ``request`` (a ``LoadRequest``, or one planned already), close
    ``previous``, load the new model on ``engine_factory()`` (default: llama.cpp's);
    when that fails, load ``previous`` again as it was. A fit that fails leaves
    ``previous`` untouched."""
    try:
        planned = (request if isinstance(request, Planned) else plan(request)).check()
    except Exception as exc:  # noqa: BLE001 - a bad file or a model that does not fit: the previous one stays
        return Switched(None, exc, kept=previous is not None)
    if previous is not None:
        previous.engine.close()
    try:
        engine = engine_factory() if engine_factory is not None else None
        return Switched(load(planned, engine))
    except Exception as exc:  # noqa: BLE001 - the previous model comes back; the caller shows why
        if previous is None:
            return Switched(None, exc)
        return _restore(previous, exc)


def _restore(previous: Previous, error: Exception) -> Switched:
    try:
        previous.engine.load(previous.path, previous.config)
        if previous.lora:
            previous.engine.load_adapters(list(previous.lora))
    except Exception as again:  # noqa: BLE001 - said with the first failure
        previous.engine.close()
        return Switched(None, error, restore_error=again)
    projector_error = None
    if previous.projector is not None:
        load_projector = getattr(previous.engine, "load_projector", None)
        try:
            if load_projector is None:
                raise NoImages("this engine takes no images")
            load_projector(previous.projector)
        except Exception as exc:  # noqa: BLE001 - the model is back; its projector is a note
            projector_error = exc
    return Switched(None, error, kept=True, projector_error=projector_error)
