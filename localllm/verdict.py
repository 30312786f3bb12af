"""Does a model fit a budget? One planner verdict, phrased for a table.

Used by ``list`` (this machine's budget, or ``--vram``), ``list --catalog`` (4 GiB
and 6 GiB laptops) and ``pull --vram`` (the largest quant that fits). The question
asked of the planner is the one ``run`` asks: every layer on the GPU at
min(trained context, 4096) with an f16 cache, else a q8_0/q4_0 cache, else a
smaller context (down to 2048), else fewer layers on the GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from localllm import planner
from localllm.backend import LoadConfig, run_config

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class Verdict:
    fits: bool  # runs within the budget at all
    full_gpu: bool  # every layer on the GPU (always True with no GPU budget, if RAM holds it)
    n_ctx: int
    kv_type: str
    n_gpu_layers: int
    n_layers: int  # repeating layers + the output layer
    gpu_bytes: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(shape: planner.ModelShape, trained_ctx: int, gpu_budget: int | None, ram: int | None, ctx: int | None = None) -> Verdict:
    want = run_config(LoadConfig(n_ctx=ctx or min(trained_ctx or DEFAULT_CTX, DEFAULT_CTX)))
    r = planner.fit(shape, want, gpu_budget=gpu_budget, ram=ram, policy="ctx", ctx_limit=want.n_ctx)
    c = r.config
    n_all = shape.n_layer + 1
    on_gpu = n_all if c.n_gpu_layers < 0 else min(c.n_gpu_layers, n_all)
    full = gpu_budget is None or on_gpu >= n_all
    gpu_bytes = r.plan.total_gpu_bytes
    if not r.fits:
        need = r.plan.total_gpu_bytes if gpu_budget is not None else r.plan.total_cpu_bytes
        text = f"no: needs {_gb(need)}"
    elif not full:
        text = f"partly: {on_gpu}/{n_all} layers on GPU, ctx {c.n_ctx}"
    else:
        kv = "" if c.type_k == "f16" else f", {c.type_k} KV"
        text = f"yes: ctx {c.n_ctx}{kv}"
    return Verdict(r.fits, r.fits and full, c.n_ctx, c.type_k, on_gpu, n_all, gpu_bytes, text)


def _gb(n: int) -> str:
    from localllm.units import format_size

    return format_size(n, "GiB", digits=1)
