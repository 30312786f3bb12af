"""Does it fit? The one fitting service.

Given what the user fixed (the model's shape, the requested load config and
which of its settings are the user's own choice) and the hardware budget, say
what to load and how that compares with what was asked: an ``Outcome`` to
branch on, the numbers (the memory plan, the layers on the GPU, the largest
context per cache type) and a sentence for people. Every caller asks here: the
loading commands (run, chat, plan, doctor, serve, through
``commands/_common.fit_config``), the cockpit and its models screen, ``list``,
``pull --vram`` and the catalog verdicts (through ``verdict.judge``).

One code path for every set of devices: the CPU alone, one local GPU, or
``--rpc`` workers' devices go through ``placement.fit_across`` (the memory per
device from ``placement.place``, the search from ``planner.search``). Pure
Python: no I/O, no llama.cpp.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.engine_api import LoadConfig
from localllm.engine_api.llama_rules import flash_attn_mode
from localllm.modelfile.gguf_file import read_header
from localllm.modelfile.lora import check_adapter
from localllm.modelfile.model_info import describe
from localllm.plan import placement, planner

if TYPE_CHECKING:
    from localllm.modelfile.gguf_file import GGUFHeader
    from localllm.plan.placement import Device, Placement

DEFAULT_CTX = 4096  # the context asked when the user names none (at most the trained one)


class Outcome(Enum):
    """How the settings to load compare with the ones asked for."""

    FITS_AS_ASKED = "fits_as_asked"  # every setting as asked
    FITS_REDUCED = "fits_reduced"  # a cheaper cache type or a smaller context; the layers where asked
    PARTIAL_OFFLOAD = "partial_offload"  # fewer layers on the GPU (or offload devices) than asked, or a MoE's experts moved to RAM
    CPU_ONLY = "cpu_only"  # the GPU budget holds not even one layer: everything on the CPU
    DOES_NOT_FIT = "does_not_fit"  # not even at the smallest settings


@dataclass(frozen=True)
class Budget:
    """What the model may use: GPU bytes (None: no GPU budget) and RAM bytes
    available (None: unknown, not checked)."""

    gpu: int | None
    ram: int | None

    @classmethod
    def of(cls, hw: Any) -> Budget:
        """The budget of a ``hardware.Hardware``."""
        return cls(hw.gpu_budget, hw.ram_available_bytes)


@dataclass(frozen=True)
class Request:
    """What the user asked: the config (unset options at their defaults), which
    of its settings the user fixed (kept as they are), and the policy when it
    does not fit: shrink the context first (``ctx``) or offload fewer layers
    (``offload``)."""

    config: LoadConfig
    kv_fixed: bool = False
    ngl_fixed: bool = False
    policy: str = "ctx"
    moe_fixed: bool = False  # the experts in RAM (n_cpu_moe) were given: kept; otherwise a MoE's fit may move them
    adapters: tuple[Any, ...] = ()  # LoRA adapters to load with it (modelfile.lora.AdapterInfo): checked and counted by fit_header
    ctx_default: bool = False  # the context is a server's default nobody named (default_ctx): it gives way first (planner.search)


@dataclass(frozen=True)
class LoadOptions:
    """The load options a user gives, in one shape for the CLI's flags
    (``commands._common.load_options``), the cockpit's settings
    (``Settings.load_options``) and the library (``api.fit``/``api.load``): what
    is None was not given, so the fit may choose it."""

    n_ctx: int | None = None  # None: the plan decides (``default_ctx``, from the model's trained context)
    threads: int | None = None
    n_gpu_layers: int | None = None  # None: as many as fit (-1 asks for all)
    type_k: str | None = None  # None: f16, or a cheaper type where the fit needs one
    type_v: str | None = None
    flash_attn: str = "auto"
    swa_full: bool = False
    n_batch: int = 512
    n_ubatch: int = 512
    policy: str = "ctx"
    rpc_servers: tuple[str, ...] = ()
    n_cpu_moe: int | None = None  # experts in RAM: layers 0..N-1, -1 all (LoadConfig.n_cpu_moe); None: none, or the fit's choice

    def config(self) -> LoadConfig:
        """The load config asked: a quantized V cache turns flash attention on
        (``llama_rules.flash_attn_mode``); the physical batch is never above the
        logical one (``LoadConfig``). A context not given stands at ``DEFAULT_CTX``
        here, until the model's header decides it (``for_header``)."""
        type_v = self.type_v or "f16"
        return LoadConfig(
            n_ctx=self.n_ctx or DEFAULT_CTX, n_threads=self.threads, n_gpu_layers=-1 if self.n_gpu_layers is None else self.n_gpu_layers,
            flash_attn=flash_attn_mode(self.flash_attn, type_v), type_k=self.type_k or "f16", type_v=type_v,
            n_batch=self.n_batch, n_ubatch=self.n_ubatch, swa_full=self.swa_full, rpc_servers=self.rpc_servers,
            n_cpu_moe=self.n_cpu_moe or 0,
        )

    def request(self) -> Request:
        """What the fitting service is asked: the config, with the cache types
        and GPU layers that were given kept as they are."""
        return Request(self.config(), kv_fixed=self.type_k is not None or self.type_v is not None,
                       ngl_fixed=self.n_gpu_layers is not None, policy=self.policy, moe_fixed=self.n_cpu_moe is not None)


@dataclass(frozen=True)
class Fit:
    outcome: Outcome
    asked: LoadConfig
    config: LoadConfig  # what to load
    plan: planner.MemoryPlan  # of ``config`` (of ``asked`` when it does not fit)
    gpu_budget: int | None  # GPU bytes (with --rpc devices: their free memory summed)
    ram: int | None
    margin: int  # GPU bytes kept free
    n_layers: int  # repeating layers + the output layer
    gpu_layers: int  # of n_layers, placed on the GPU (or offload devices) by ``config``
    sentence: str  # for people: "fits as asked", what changed, or why it does not fit
    changes: tuple[str, ...] = ()
    max_ctx_by_kv_type: Mapping[str, int] = field(default_factory=dict)  # searched when first read (planner.LazyTable)
    trained_ctx: int | None = None
    shift_extra_bytes: int | None = None  # what a shiftable (full-size SWA) cache costs more; None if it shifts already
    placement: Placement | None = None  # with offload devices: per device
    ctx_default: bool = False  # the context asked was a server's default nobody named (Request.ctx_default)

    @property
    def fits(self) -> bool:
        return self.outcome is not Outcome.DOES_NOT_FIT

    @property
    def full_gpu(self) -> bool:
        """It fits with every layer on the GPU (always, with no GPU budget)."""
        return self.fits and (self.gpu_budget is None or self.gpu_layers >= self.n_layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "fits": self.fits,
            "reason": self.sentence,
            "asked": self.asked.to_dict(),
            "config": self.config.to_dict(),
            "n_layers": self.n_layers,
            "gpu_layers": self.gpu_layers,
            "budget_gpu_bytes": self.gpu_budget,
            "ram_available_bytes": self.ram,
            "margin_bytes": self.margin,
            "max_ctx_by_kv_type": dict(self.max_ctx_by_kv_type),
        }


def default_ctx(trained_ctx: int | None, *, serving: bool = False) -> int:
    """The context to ask for when the user names none, decided here alone.

    A server (``serve MODEL``, and each model of the router) asks for the
    trained context, as llama-server's default ``-c 0`` does: coding agents
    send 6,000-20,000 tokens before the user types anything (Codex 6,179,
    opencode 7,300-11,000, Claude Code about 11,500, issue 59). What is asked is
    then fitted (policy ``ctx``): the largest context the device holds when the
    trained one does not fit, which the fit's sentence says. The context is
    each sequence's (serve's ``--ctx``): the pool holds ``--parallel`` of them,
    so that every request may use it at once, where llama-server's unified pool
    holds the trained context for all its slots together (tools/server/server.cpp,
    ``n_parallel`` auto: 4, ``kv_unified``). At the default ``--parallel 4``
    that is four times llama-server's cells, measured in llama.cpp's log:
    SmolLM2 135M 720 MiB of KV cache (32,768 cells, 360 MiB at 4096 a
    sequence), Gemma 3 270M 421.5 MiB (131,072 cells on its 3 global layers,
    384 MiB; its 15 sliding-window layers hold 2,560 cells, 37.5 MiB, whatever
    the context; 85.5 MiB at 4096 a sequence). ``run``, ``chat``
    and the cockpit ask for the trained one up to 4096: one conversation that
    grows by turns, whose sliding window keeps it going past the context."""
    if serving:
        return trained_ctx or DEFAULT_CTX
    return min(trained_ctx or DEFAULT_CTX, DEFAULT_CTX)


def measured_ctx(need: int) -> int:
    """The context a measurement asks when the user names none (``bench``): what
    its longest prompt and reply need, in whole 256-cell steps (llama.cpp pads
    the cache to 256 anyway). Decided here, with ``default_ctx``."""
    return (need + 255) // 256 * 256


@dataclass(frozen=True)
class ContextChoice:
    """The context a sequence gets and why: serve's start line, ``plan``, and
    ``/api/ps`` (which ``localllm ps`` shows). ``why``: ``trained`` (the model's
    trained context), ``fitted`` (the largest that fits the device, below what
    was asked), ``asked`` (a typed ``--ctx``, a config or preset value) or
    ``default`` (no context named and none trained, or ``run``'s cap of
    ``DEFAULT_CTX``)."""

    n_ctx: int  # each sequence's
    asked: int  # each sequence's
    trained: int | None
    why: str

    @property
    def reason(self) -> str:
        """"trained", "largest that fits; trained 32768", "as asked; trained 8192", ..."""
        t = self.trained
        if self.why == "fitted":
            return "largest that fits; " + (f"trained {t}" if self.asked == t else f"asked {self.asked}" + (f", trained {t}" if t else ""))
        if self.why == "trained":
            return "trained"
        if self.why == "default":
            return f"run's default, at most {DEFAULT_CTX}; trained {t}" if t else "default; the model names no trained context"
        return "as asked" + (f"; {'beyond the ' if self.n_ctx > t else ''}trained {t}" if t else "")

    def __str__(self) -> str:
        return f"{self.n_ctx} ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "asked": self.asked, "trained": self.trained, "why": self.why, "text": str(self)}


def context_choice(fit: Fit, n_seq: int = 1, *, default: bool | None = None) -> ContextChoice:
    """Why a load has the context it has, per sequence, against what was asked
    and what the model was trained on. ``default``: no context was named, so
    ``default_ctx`` chose what was asked (a server's trained one, ``run``'s at
    most 4096); None: as the fit knows it (``Fit.ctx_default``, a server's)."""
    n = max(n_seq, 1)
    default = fit.ctx_default if default is None else default
    per, asked, trained = fit.config.n_ctx // n, fit.asked.n_ctx // n, fit.trained_ctx
    if per < asked:
        why = "fitted"
    elif trained and per == trained:
        why = "trained"
    else:
        why = "default" if default else "asked"
    return ContextChoice(per, asked, trained, why)


def context_why(fit: Fit, n_seq: int = 1, *, default: bool | None = None) -> str:
    """``context_choice`` in words: "32768 (trained)", "12288 (largest that fits; trained 32768)"."""
    return str(context_choice(fit, n_seq, default=default))


def layers_on(cfg: LoadConfig, n_layers: int) -> int:
    """Of ``n_layers`` (repeating + output), how many ``cfg`` puts on the GPU."""
    return n_layers if cfg.n_gpu_layers < 0 else min(cfg.n_gpu_layers, n_layers)


def fit(
    shape: planner.ModelShape,
    request: Request,
    budget: Budget,
    *,
    trained_ctx: int | None = None,
    ctx_limit: int | None = None,
    devices: list[Device] | None = None,
    cpu: Device | None = None,
    header: GGUFHeader | None = None,
) -> Fit:
    """Fit ``request`` to ``budget``. ``ctx_limit`` bounds the largest-context
    table (default: the larger of the asked and the trained context). With
    ``devices`` (``--rpc``: the workers' devices and a local GPU) and ``cpu``,
    layers are placed across them and the fit keeps the placement per device;
    without, the devices are the budget's GPU (if any) and the CPU."""
    want = request.config
    planner.check_moe(shape, want)  # experts in RAM for a model without experts: refused, as a cache type llama.cpp refuses
    if request.kv_fixed:
        planner.check_cache_types(shape, want)  # cache types llama.cpp refuses for this model: refused here too
    limit = ctx_limit or max(want.n_ctx, trained_ctx or 0)
    across = devices is not None  # --rpc: the workers' devices (and a local GPU), shown per device
    if devices is None:
        devices = [placement.Device("GPU", "gpu", budget.gpu)] if budget.gpu is not None else []
        cpu = placement.Device("CPU", "cpu", budget.ram)
    assert cpu is not None, "devices go with the cpu device"
    r, placed = placement.fit_across(
        shape, want, devices, cpu, ram=budget.ram, policy=request.policy,
        kv_fixed=request.kv_fixed, ngl_fixed=request.ngl_fixed, ctx_limit=limit, header=header, moe_fixed=request.moe_fixed,
        ctx_first=request.ctx_default,
    )
    config = replace(r.config, tensor_split=placed.split) if across else r.config
    has_gpu = bool(devices)
    n_all = shape.n_layer + 1
    asked_on, got_on = layers_on(want, n_all), layers_on(r.config, n_all)
    if not r.fits:
        outcome = Outcome.DOES_NOT_FIT
    elif r.config == want:
        outcome = Outcome.FITS_AS_ASKED
    elif has_gpu and got_on == 0 < asked_on:
        outcome = Outcome.CPU_ONLY
    elif has_gpu and (got_on < asked_on or r.config.n_cpu_moe != want.n_cpu_moe):
        outcome = Outcome.PARTIAL_OFFLOAD  # fewer layers, or experts moved to RAM
    else:
        outcome = Outcome.FITS_REDUCED
    extra = None
    c = r.config
    if shape.swa_layers and shape.n_swa and not c.swa_full:
        full = planner.plan_memory(shape, replace(c, swa_full=True), gpu=budget.gpu is not None)
        extra = full.kv_cache_bytes - r.plan.kv_cache_bytes
    return Fit(
        outcome=outcome, asked=want, config=config, plan=r.plan, gpu_budget=r.budget_bytes, ram=r.ram_bytes,
        margin=r.margin_bytes, n_layers=n_all, gpu_layers=got_on, sentence=r.reason, changes=tuple(r.steps),
        max_ctx_by_kv_type=r.max_ctx_by_kv_type, trained_ctx=trained_ctx, shift_extra_bytes=extra, placement=placed if across else None,
        ctx_default=request.ctx_default,
    )


def fit_header(header: GGUFHeader, request: Request, budget: Budget, *, compute_scale: float = 1.0, **kw: Any) -> Fit:
    """``fit`` for a model's GGUF header (its shape, its trained context, and
    its tensors for placing layers across ``devices``). ``compute_scale``
    corrects an estimated compute buffer by what llama.cpp's dry run found
    (``plan.prepare``); the replayed one is exact and never scaled."""

    for adapter in request.adapters:
        check_adapter(adapter, header)  # another architecture or embedding size: one line naming both, before llama.cpp
    shape = planner.ModelShape.from_header(header).with_adapters(request.adapters)
    if compute_scale != 1.0:
        shape = replace(shape, compute_scale=compute_scale)
    return fit(shape, request, budget, trained_ctx=describe(header).context_length, header=header, **kw)


def fit_file(path: Path, request: Request, hw: Any, *, n_ctx: int | None = None, n_seq: int = 1, serving: bool = False, **kw: Any) -> Fit:
    """``fit`` for a model file and a ``hardware.Hardware``: the context asked
    (``n_ctx``, or ``default_ctx`` of the model's trained one) replaces the
    request's. ``n_seq`` > 1 plans serve's batch engine as it loads: one unified
    cache for ``n_seq`` sequences and one row of logits per sequence.
    ``serving``: as ``for_header``. ``kw``: ``devices`` and ``cpu`` for a load
    across several devices."""
    header = read_header(path)
    return fit_header(header, for_header(header, request, n_ctx=n_ctx, n_seq=n_seq, serving=serving), Budget.of(hw), **kw)


def for_header(header: GGUFHeader, request: Request, *, n_ctx: int | None = None, n_seq: int = 1, serving: bool = False) -> Request:
    """``request`` with the context asked (``n_ctx``, or ``default_ctx`` of the
    model's trained one) and, for ``n_seq`` > 1, serve's batch engine: one
    unified cache for ``n_seq`` sequences and one row of logits per sequence.
    ``serving`` with no ``n_ctx``: a server's default, the trained context for
    each of the ``n_seq`` sequences, which gives way first where it does not fit
    (``Request.ctx_default``). Serve, the router and ``plan``'s serve line all
    ask here, so the default is decided once."""
    trained = describe(header).context_length
    if n_ctx is None and serving:
        n_ctx = default_ctx(trained, serving=True) * max(n_seq, 1)
        request = replace(request, ctx_default=True)
    config = replace(request.config, n_ctx=n_ctx or default_ctx(trained))
    if n_seq > 1:
        config = replace(config, n_seq=n_seq, n_outputs_max=max(n_seq, config.n_outputs_max), kv_unified=True)
    return replace(request, config=config)
