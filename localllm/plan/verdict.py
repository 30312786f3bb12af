"""Does a model fit a budget? The fitting service's answer, phrased for a table.

Used by ``list`` (this machine's budget, or ``--vram``), ``list --catalog`` (4 GiB
and 6 GiB laptops) and ``pull --vram`` (the largest quant that fits). The question
asked of ``fitting`` is the one ``run`` asks with no options: every layer on the
GPU at min(trained context, 4096) with an f16 cache, else a q8_0/q4_0 cache,
else a smaller context (down to 2048), else fewer layers on the GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from localllm.engine_api import LoadConfig
from localllm.plan import fitting, planner
from localllm.util.units import format_size

# The RAM bandwidth a verdict's decode rate assumes (the figure is labelled with
# it): a laptop's dual-channel DDR4-3200, 51.2 GB/s peak, rounded down. DDR5-5600
# doubles it; ``plan`` measures this machine's instead.
RAM_BANDWIDTH = 50e9


@dataclass(frozen=True)
class Verdict:
    outcome: fitting.Outcome
    fits: bool  # runs within the budget at all
    full_gpu: bool  # every layer on the GPU (always True with no GPU budget, if RAM holds it)
    n_ctx: int
    kv_type: str
    n_gpu_layers: int
    n_layers: int  # repeating layers + the output layer
    gpu_bytes: int
    text: str
    n_cpu_moe: int = 0  # a MoE's experts the fit keeps in RAM (LoadConfig.n_cpu_moe: -1 all)
    ram_bytes: int = 0  # what the CPU side needs (the experts in RAM included)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome.value}


def judge(shape: planner.ModelShape, trained_ctx: int, gpu_budget: int | None, ram: int | None, ctx: int | None = None) -> Verdict:
    n_ctx = ctx or fitting.default_ctx(trained_ctx)
    f = fitting.fit(shape, fitting.Request(LoadConfig(n_ctx=n_ctx)), fitting.Budget(gpu_budget, ram), trained_ctx=trained_ctx, ctx_limit=n_ctx)
    return of_fit(f, (f.plan.total_gpu_bytes, f.plan.total_cpu_bytes), shape)


def of_fit(f: fitting.Fit, totals: tuple[int, int], shape: planner.ModelShape | None = None) -> Verdict:
    """The verdict on a fit, with its (GPU, CPU) totals: the planner's, or the
    refereed ones of ``prepare.LoadPlan.total``. A MoE whose experts the fit
    keeps in RAM says so, with the RAM it needs and, given its ``shape``, the
    decode rate the RAM part allows at ``RAM_BANDWIDTH``."""
    c = f.config
    if not f.fits:
        ram_short = f.ram is not None and totals[1] > f.ram
        need = totals[0] if f.gpu_budget is not None and not ram_short else totals[1]
        text = f"no: needs {_gb(need)}" + (" of RAM" if ram_short else "")
    elif c.n_cpu_moe and f.gpu_layers:
        head = "yes" if f.full_gpu else f"partly ({f.gpu_layers}/{f.n_layers} layers on GPU)"
        text = f"{head}, experts in RAM ({_gb(totals[1])} of RAM): ctx {c.n_ctx}" + (f", {c.type_k} KV" if c.type_k != "f16" else "")
        if shape is not None:
            ram_read = planner.weights_read_per_token(shape) - planner.gpu_read_per_token(shape, f.plan, True)
            text += f", ≤ {RAM_BANDWIDTH / ram_read:.0f} t/s at {RAM_BANDWIDTH / 1e9:.0f} GB/s RAM" if ram_read else ""
    elif not f.full_gpu:
        text = f"partly: {f.gpu_layers}/{f.n_layers} layers on GPU, ctx {c.n_ctx}"
    else:
        kv = "" if c.type_k == "f16" else f", {c.type_k} KV"
        text = f"yes: ctx {c.n_ctx}{kv}"
    return Verdict(f.outcome, f.fits, f.full_gpu, c.n_ctx, c.type_k, f.gpu_layers, f.n_layers, totals[0], text, c.n_cpu_moe, totals[1])


def _gb(n: int) -> str:

    return format_size(n, "GiB", digits=1)
