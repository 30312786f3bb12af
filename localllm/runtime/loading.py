"""Step two of a load, and the whole of it: ``open_model``.

``load(planned)`` is the one place an engine loads a model for a front end:
the fitted config (serve's batch engine with its sequences), the memory check
of that load against the plan (``plan.memcheck``, given the header the plan
read), the LoRA adapters, the projector, the chat template. Any failure closes
the engine before it is raised, so no front end is left holding half a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm.engine_api import LoadConfig
from localllm.errors import InputError
from localllm.plan.memcheck import MemoryCheck, check_after_load
from localllm.runtime.errors import NoImages
from localllm.runtime.planning import Planned, plan
from localllm.runtime.request import LoadRequest


@dataclass
class Loaded:
    """A loaded model: the engine (an ``Engine``, or serve's ``BatchModel``) and
    what the load found. ``with`` closes the engine."""

    planned: Planned
    engine: Any
    info: Any  # the engine's LoadInfo (BatchLoadInfo for serve's engine)
    memory_check: MemoryCheck | None  # None: llama.cpp logged no allocations (or the engine keeps no log)
    adapters: list[Any] = field(default_factory=list)  # what the engine's load_adapters returned, by id
    projector: Any = None  # vision.projector.ProjectorInfo of the projector loaded, or None
    projector_error: Exception | None = None  # why an optional projector was not loaded (the model runs text only)

    @property
    def path(self) -> Path:
        return self.planned.path

    @property
    def config(self) -> LoadConfig:
        """What was loaded."""
        return self.planned.config

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Loaded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def new_engine(serving: bool) -> Any:
    """llama.cpp's engine: serve's batch engine, or one conversation's."""
    if serving:
        from localllm.engine.batch import BatchModel  # lazy: loads llama.cpp (~155 ms here), which planning does not need

        return BatchModel()
    from localllm.engine import LlamaCppBackend  # lazy: as above

    return LlamaCppBackend()


def load(planned: Planned, engine: Any = None) -> Loaded:
    """Load what ``planned`` fitted (``DoesNotFit`` first where it does not fit)
    on ``engine`` (default: llama.cpp's, serve's batch engine for a server). A
    failure at any step closes the engine and is raised."""
    planned = planned.check()
    request = planned.request
    if engine is None:
        engine = new_engine(request.serving)
    try:
        info, check = _load_checked(engine, planned)
        adapters = _adapters(engine, request)
        projector, projector_error = _projector(engine, request)
        if request.template is not None:
            _use_template(engine, request.template)
    except BaseException:
        engine.close()
        raise
    return Loaded(planned, engine, info, check, adapters, projector, projector_error)


def open_model(request: LoadRequest, engine: Any = None) -> Loaded:
    """Resolve, read the header once, fit, refuse what does not fit
    (``DoesNotFit``), load, check the memory, adapters, projector, template."""
    return load(plan(request), engine)


def _load_checked(engine: Any, planned: Planned) -> tuple[Any, MemoryCheck | None]:
    """The engine's load of the fitted config, and the memory check of that load
    (llama.cpp's logged allocations against the refereed plan)."""
    cfg, request = planned.config, planned.request
    if request.serving:
        info = engine.load(planned.path, cfg, max(request.parallel, 1), header=planned.header)  # serve's batch engine: one unified cache of n sequences
    else:
        info = engine.load(planned.path, cfg, header=planned.header)  # the header read once, by plan
    log = getattr(engine, "load_log", None)  # serve's batch engine keeps none
    if log is None:
        return info, None
    return info, check_after_load(planned.path, cfg, log, planned.placement, planned.lp.plan, header=planned.header)


def _adapters(engine: Any, request: LoadRequest) -> list[Any]:
    """``--lora``: each file checked against the model's header by the engine (one line naming the cause)."""
    if not request.lora:
        return []
    load_adapters = getattr(engine, "load_adapters", None)
    if load_adapters is None:
        raise InputError("this engine cannot load LoRA adapters")
    return list(load_adapters(list(request.lora)))


def _projector(engine: Any, request: LoadRequest) -> tuple[Any, Exception | None]:
    """The projector on the loaded model. An optional one (the cockpit's) that
    fails is returned as the reason, and the model runs text only."""
    path = request.projector
    if path is None:
        return None, None
    load_projector = getattr(engine, "load_projector", None)  # the scripted fake takes no images
    if load_projector is None:
        if request.projector_optional:
            return None, NoImages("this engine takes no images")
        raise NoImages(f"this engine takes no images: the projector {path.name} is not loaded")
    if not request.projector_optional:
        return load_projector(path), None
    try:
        return load_projector(path), None
    except Exception as exc:  # noqa: BLE001 - the model is loaded; a projector llama.cpp refuses leaves it text only
        return None, exc


def _use_template(engine: Any, spec: str) -> None:
    """``--template FILE|NAME``: the chat template used instead of the model's."""
    use = getattr(engine, "use_template", None)
    if use is None:  # serve's batch engine: its tokenizer holds the template
        use = engine.tok.template.use
    use(spec)
