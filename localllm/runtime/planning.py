"""Step one of a load: the file, its header read once, the fit, refereed.

``plan(request)`` resolves the model, reads its GGUF header (the one read of
this load: the fit, the projector check, the memory check after the load and
the cockpit's memory panel all take it from the ``Planned``), detects the
budget and asks the fitting service (``plan.prepare.prepare_load``). It never
raises for a model that does not fit: ``plan`` shows such a fit, and
``Planned.check`` turns it into ``DoesNotFit`` where a load follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localllm.engine_api import LoadConfig
from localllm.errors import InputError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.plan import fitting, hardware, placement, referee
from localllm.plan.hardware import Hardware
from localllm.plan.prepare import LoadPlan, prepare_load
from localllm.runtime.errors import DoesNotFit
from localllm.runtime.request import LoadRequest
from localllm.store import resolver
from localllm.util.units import parse_size
from localllm.vision import choice as projector_choice


def resolve(model: str | Path | None) -> Path:
    """The GGUF file a model name or path stands for (``localllm list`` shows the names)."""
    return resolver.resolve(None if model is None else str(model))


def vram_bytes(vram: int | str | None) -> int | None:
    """``vram`` as bytes: an int is bytes, a string has its unit ("4GiB", "6 GB")."""
    if vram is None or isinstance(vram, int):
        return vram
    return parse_size(vram)  # a Size: bytes that keep their unit for messages


def _local_gpu() -> bool:
    from localllm.engine.rpc import has_local_gpu  # lazy: loads llama.cpp (~169 ms here), asked only with rpc and vram

    return has_local_gpu()


def prepare(path: Path, request: fitting.Request, *, vram: int | str | None = None, n_ctx: int | None = None, n_seq: int = 1,
            rpc: Sequence[object] = (), hw: Hardware | None = None, dry_run: bool = True, cross_check: bool = False,
            serving: bool = False, header: GGUFHeader | None = None) -> LoadPlan:
    """The fitting service asked about ``path`` with a full ``fitting.Request``,
    refereed by llama.cpp's dry run where the graph replay does not cover the
    model; a config llama.cpp refuses is an ``EngineError``. ``vram`` overrides
    the detected GPU budget (``hw``: detected already); ``rpc`` lists workers
    whose devices join this machine's (each probed first); ``header``: read
    already. ``n_ctx`` None: the plan's default (``fitting.for_header``)."""
    hw = hw if hw is not None else hardware.detect(vram_bytes(vram))
    runner = referee.dry_run if dry_run else None
    if rpc:
        devices, cpu = placement.rpc_devices(list(rpc), hw, _local_gpu)
        return prepare_load(path, request, hw, n_ctx=n_ctx, n_seq=n_seq, devices=devices, cpu=cpu, dry_run=runner, serving=serving,
                            header=header)
    return prepare_load(path, request, hw, n_ctx=n_ctx, n_seq=n_seq, dry_run=runner, cross_check=cross_check, serving=serving,
                        header=header)


@dataclass(frozen=True)
class Planned:
    """A request fitted: the file, its header, the refereed plan (``prepare.LoadPlan``)."""

    request: LoadRequest
    path: Path
    header: GGUFHeader
    lp: LoadPlan
    checked: bool = False  # ``check`` passed: not asked again (the projector's header read again) on the way to the load

    @property
    def fit(self) -> fitting.Fit:
        return self.lp.fit

    @property
    def config(self) -> LoadConfig:
        """What will be loaded; serve's pool is a whole number of sequences."""
        cfg = self.lp.config
        n = max(self.request.parallel, 1)
        return cfg if cfg.n_ctx % n == 0 else replace(cfg, n_ctx=cfg.n_ctx // n * n)

    @property
    def placement(self) -> Any:  # placement.Placement over --rpc devices, else None
        return self.lp.placement

    def check(self) -> Planned:
        """``DoesNotFit`` where the fit found no settings, and one line where the
        projector does not fit beside the model (``vision.choice.shortfall``)."""
        if self.checked:
            return self
        if not self.fit.fits:
            raise DoesNotFit.of(self.fit)
        if self.request.projector is not None:
            short = projector_choice.shortfall(self.fit, self.request.projector)
            if short:
                raise InputError(short)
        return replace(self, checked=True)


def plan(request: LoadRequest) -> Planned:
    """Resolve, read the header once, fit (refereed). Raises for a file that is
    missing or malformed and for a config llama.cpp refuses; not for one that
    does not fit (``Planned.check``)."""
    path = resolve(request.model)
    header = read_header(path)  # the one read of this load: everything after takes it from the Planned
    lp = prepare(path, request.fit_request(), vram=request.vram, n_ctx=request.options.n_ctx, n_seq=max(request.parallel, 1),
                 rpc=request.rpc, hw=request.hardware, dry_run=request.dry_run, cross_check=request.cross_check,
                 serving=request.serving, header=header)
    return Planned(request, path, header, lp)
