"""Placement across several devices: this machine's CPU (and GPU), and the
devices of llama.cpp RPC workers. Pure Python over planner.py's public functions.

llama.cpp's rules (the vendored llama.cpp of llama-cpp-python 0.3.36):

- device order: RPC devices first, then local GPUs (llama.cpp
  ``llama_prepare_model_devices``: "add RPC servers at the front of the list to
  minimize network transfers"); the CPU is not in the list, it takes what is
  not offloaded;
- which layers are offloaded: the same rule as one GPU (planner.offload: the
  last ``n_gpu_layers`` of ``n_layer + 1``, the output layer counted last);
- which device an offloaded layer goes to (llama-model.cpp ``load_tensors``):
  ``upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)`` over the
  cumulative, normalised split, in float32; the split defaults to each device's
  free memory. We hand llama.cpp the split we planned with (``tensor_split``),
  so the load follows the plan even if a worker's free memory moved meanwhile;
- the KV cache of a layer lives on that layer's device (llama-kv-cache.cpp,
  one buffer per device and per cache: full-attention, then sliding-window);
- the output (logits) buffer is host memory (llama-context.cpp ``output_reserve``
  takes the CPU's host buffer type: an RPC device has none), so it is always the CPU's;
- compute buffers (ggml_backend_sched): every device that runs part of the
  graph gets one, sized for the peak of its part of the worst-case graph; see
  ``_compute``. Remote devices differ from a local GPU in one rule here: an RPC
  device has no host buffer type and no ``offload_op``, so large CPU-side
  batches are never moved to it, and the CPU's part of the graph (the input
  embeddings, and all non-offloaded layers) is computed on the CPU.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any

from localllm import planner
from localllm.fmt import size
from localllm.planner import MemoryPlan, ModelShape, RunConfig


@dataclass(frozen=True)
class Device:
    name: str  # as llama.cpp names its buffers: RPC0[host:port], CUDA0, CPU
    kind: str  # "rpc", "gpu" or "cpu"
    free_bytes: int | None
    total_bytes: int | None = None


@dataclass
class DeviceUse:
    device: Device
    layers: list[int]
    output_layer: bool
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int  # the logits buffer (host memory: the CPU's)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.device.name,
            "kind": self.device.kind,
            "layers": len(self.layers),
            "output_layer": self.output_layer,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "total_bytes": self.total_bytes,
            "free_bytes": self.device.free_bytes,
        }


@dataclass
class Placement:
    plan: MemoryPlan  # the whole model's plan (all offload devices counted as "GPU")
    uses: list[DeviceUse]  # offload devices in llama.cpp's order, then the CPU
    split: tuple[float, ...]  # tensor_split, one per offload device
    rules: list[str] = field(default_factory=list)

    def to_list(self) -> list[dict[str, Any]]:
        return [u.to_dict() for u in self.uses]


def layer_devices(n_layer: int, n_gpu_layers: int, split: list[float]) -> list[int | None]:
    """For each of the ``n_layer + 1`` layers (the last is the output layer), the
    index of its offload device, or None for the CPU. float32 as in llama.cpp."""
    import numpy as np

    n_all = n_layer + 1
    if not split:
        return [None] * n_all
    ngl = n_all if n_gpu_layers < 0 else min(n_gpu_layers, n_all)
    start = max(n_all - ngl, 0)
    cum = np.cumsum(np.asarray(split, dtype=np.float32), dtype=np.float32)
    cum = (cum / cum[-1]).astype(np.float32)
    points = [float(x) for x in cum]
    out: list[int | None] = []
    for il in range(n_all):
        if il < start or il - start >= ngl:
            out.append(None)
        else:
            frac = float(np.float32(il - start) / np.float32(ngl))
            out.append(min(bisect.bisect_right(points, frac), len(split) - 1))
    return out


def place(shape: ModelShape, cfg: RunConfig, devices: list[Device], cpu: Device, split: list[float] | None = None) -> Placement:
    """Per-device weights, KV cache, compute and output bytes for ``cfg`` over
    the offload ``devices`` (llama.cpp's order) and the CPU."""
    if split is None:
        split = [float(d.free_bytes or 0) for d in devices]
        if devices and not any(split):
            split = [1.0] * len(devices)
    plan = planner.plan_memory(shape, cfg, gpu=bool(devices))
    where = layer_devices(shape.n_layer, cfg.n_gpu_layers, split) if devices else [None] * (shape.n_layer + 1)
    slots: list[Device] = [*devices, cpu]

    def slot(il: int) -> int:
        d = where[il]
        return len(devices) if d is None else d

    uses = [DeviceUse(d, [], False, 0, 0, 0, 0) for d in slots]
    for il in range(shape.n_layer):
        u = uses[slot(il)]
        u.layers.append(il)
        u.weights_bytes += shape.layer_bytes[il]
    for kl in plan.kv_layers:
        uses[slot(kl.layer)].kv_bytes += kl.k_bytes + kl.v_bytes
    out = uses[slot(shape.n_layer)]
    out.output_layer = True
    cpu_use = uses[-1]
    cpu_use.weights_bytes += shape.input_bytes
    if out is cpu_use:
        out.weights_bytes += shape.output_bytes  # a tied output reads token_embd in place
    else:
        out.weights_bytes += shape.output_bytes + shape.tied_bytes
    cpu_use.output_bytes = plan.output_bytes
    _compute(shape, cfg, plan, uses)
    rules = [
        "layers split over the offload devices in proportion to their free memory (llama-model.cpp load_tensors), passed as tensor_split",
        "RPC devices first, then local GPUs (llama.cpp llama_prepare_model_devices); token embeddings and the logits buffer stay on the CPU",
    ]
    return Placement(plan, uses, tuple(split), rules)


def _compute(shape: ModelShape, cfg: RunConfig, plan: MemoryPlan, uses: list[DeviceUse]) -> None:
    """Compute buffer per device. Each device that holds layers runs their part of
    the graph, and its buffer is that part's peak: the planner's layer-phase peak
    (planner.compute_bytes without the logits). The device with the output layer
    also runs the logits phase, so it gets the planner's full peak. The CPU, when
    it holds no layer, still computes the input embeddings (``get_rows`` of
    token_embd: n_embd x n_ubatch f32) and keeps the graph inputs it hands over."""
    cells, swa_cells = planner.kv_cells(shape, cfg)
    full = planner.compute_bytes(shape, cfg, cells, swa_cells)
    no_logits = planner.compute_bytes(replace(shape, n_vocab=0), cfg, cells, swa_cells)
    n_ctx = cells
    T = min(n_ctx, cfg.n_ubatch)
    for u in uses:
        if u.output_layer:
            u.compute_bytes = full
        elif u.layers:
            u.compute_bytes = no_logits
        elif u.device.kind == "cpu":
            u.compute_bytes = shape.n_embd * T * 4


# -- fitting the devices' budgets ------------------------------------------------------


def _fits(p: Placement, ram: int | None) -> bool:
    for u in p.uses:
        if u.device.kind == "cpu":
            if ram is not None and u.total_bytes > ram:
                return False
        elif u.device.free_bytes is not None and u.total_bytes > u.device.free_bytes - planner.default_margin(u.device.free_bytes):
            return False
    return True


def _max_ctx(shape: ModelShape, cfg: RunConfig, devices: list[Device], cpu: Device, ram: int | None, limit: int) -> int:
    lo, hi = 0, max(limit // planner.CTX_PAD, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(place(shape, planner.replace_config(cfg, n_ctx=mid * planner.CTX_PAD), devices, cpu), ram):
            lo = mid
        else:
            hi = mid - 1
    return lo * planner.CTX_PAD


def fit_across(
    shape: ModelShape,
    want: RunConfig,
    devices: list[Device],
    cpu: Device,
    *,
    ram: int | None,
    policy: str = "ctx",
    kv_fixed: bool = False,
    ngl_fixed: bool = False,
    ctx_limit: int | None = None,
) -> tuple[planner.FitResult, Placement]:
    """planner.fit's policies over several devices: cheaper cache types first,
    then fewer offloaded layers (``offload``) or a smaller context (``ctx``). Each
    offload device must keep planner.default_margin of its free memory free;
    the CPU's share must fit the RAM available."""
    limit = ctx_limit or max(want.n_ctx, planner.MIN_CTX)
    ladder = [want.type_k] if (kv_fixed or want.type_k not in planner.KV_LADDER) else list(planner.KV_LADDER[planner.KV_LADDER.index(want.type_k):])
    n_all = shape.n_layer + 1
    ngl_options = [want.n_gpu_layers] if ngl_fixed or not devices else list(range(n_all, -1, -1))

    def with_kv(cfg: RunConfig, kv: str) -> RunConfig:
        return planner.replace_config(cfg, type_k=kv, type_v=want.type_v if kv_fixed else kv)

    def ok(cfg: RunConfig) -> bool:
        return _fits(place(shape, cfg, devices, cpu), ram)

    chosen: RunConfig | None = want if ok(want) else None
    if chosen is None:
        for kv in ladder:
            cfg = with_kv(planner.replace_config(want, n_gpu_layers=ngl_options[0]), kv)
            if ok(cfg):
                chosen = cfg
                break
    if chosen is None and policy == "offload":
        for kv in ladder:
            for ngl in ngl_options:
                cfg = with_kv(planner.replace_config(want, n_gpu_layers=ngl), kv)
                if ok(cfg):
                    chosen = cfg
                    break
            if chosen is not None:
                break
    if chosen is None:
        orders = [(kv, ngl) for kv in ladder for ngl in ngl_options] if policy == "offload" else [(kv, ngl) for ngl in ngl_options for kv in ladder]
        for kv, ngl in orders:
            cfg = with_kv(planner.replace_config(want, n_gpu_layers=ngl), kv)
            n = _max_ctx(shape, cfg, devices, cpu, ram, want.n_ctx)
            if n >= min(planner.MIN_CTX, want.n_ctx):
                chosen = planner.replace_config(cfg, n_ctx=n)
                break
    fits = chosen is not None
    cfg = chosen or want
    p = place(shape, cfg, devices, cpu)
    if not fits:
        over = [u for u in p.uses if not _fits(Placement(p.plan, [u], p.split), ram)]
        reason = "does not fit even at the smallest settings: " + ", ".join(
            f"{u.device.name} needs {size(u.total_bytes)}, has {size(u.device.free_bytes if u.device.kind != 'cpu' else ram or 0)}" for u in over
        )
    elif cfg == want:
        reason = "fits as asked"
    else:
        reason = _describe_change(want, cfg, n_all)
    budgets = [d.free_bytes for d in devices if d.free_bytes is not None]
    table = {t: _max_ctx(shape, planner.replace_config(cfg, type_k=t, type_v=t), devices, cpu, ram, limit) for t in planner.KV_LADDER}
    result = planner.FitResult(
        fits, cfg, p.plan, sum(budgets) if budgets else None, ram, sum(planner.default_margin(b) for b in budgets), reason,
        [] if cfg == want else [reason], table,
    )
    return result, p


def _describe_change(want: RunConfig, got: RunConfig, n_all: int) -> str:
    parts = []
    if (got.type_k, got.type_v) != (want.type_k, want.type_v):
        parts.append(f"KV cache {got.type_k}/{got.type_v} instead of {want.type_k}/{want.type_v}")
    if got.n_ctx != want.n_ctx:
        parts.append(f"context {got.n_ctx} instead of {want.n_ctx}")
    if got.n_gpu_layers != want.n_gpu_layers and not (got.n_gpu_layers >= n_all and want.n_gpu_layers < 0):
        parts.append(f"{min(got.n_gpu_layers, n_all)} of {n_all} layers offloaded")
    return "; ".join(parts) or "fits as asked"
