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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localllm.engine_api import DryRun, LoadConfig
from localllm.engine_api.llama_rules import FFN_EXPS_REGEX, is_quantized
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.plan import moe, planner
from localllm.plan.buffer_log import buffer_lines
from localllm.plan.planner import MemoryPlan, ModelShape
from localllm.plan.workers import probe_all
from localllm.util.fmt import size


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
    kv_by_cache: list[int] = field(default_factory=list)  # one figure per KV buffer llama.cpp makes here: full-attention, then sliding-window
    mapped_bytes: int | None = None  # the CPU's: the file range llama.cpp maps for its weights (see cpu_mapped_span)
    compute_source: str = "estimate"  # or "llama.cpp's dry run" (``refereed``)

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
            "kv_by_cache": self.kv_by_cache,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "total_bytes": self.total_bytes,
            "free_bytes": self.device.free_bytes,
            "mapped_bytes": self.mapped_bytes,
            "compute_source": self.compute_source,
        }


@dataclass
class Placement:
    plan: MemoryPlan  # the whole model's plan (all offload devices counted as "GPU")
    uses: list[DeviceUse]  # offload devices in llama.cpp's order, then the CPU
    split: tuple[float, ...]  # tensor_split, one per offload device
    rules: list[str] = field(default_factory=list)

    def to_list(self) -> list[dict[str, Any]]:
        return [u.to_dict() for u in self.uses]


def _free(n: int | None) -> str:
    """A device's free memory for a message; n/a where the device did not say."""
    return "n/a" if n is None else size(n)


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


def place(
    shape: ModelShape, cfg: LoadConfig, devices: list[Device], cpu: Device, split: list[float] | None = None, header: GGUFHeader | None = None
) -> Placement:
    """Per-device weights, KV cache, compute and output bytes for ``cfg`` over
    the offload ``devices`` (llama.cpp's order) and the CPU. With the ``header``,
    also the file range the CPU maps (``mapped_bytes``)."""
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
    in_ram = shape.experts_in_ram(cfg.n_cpu_moe)  # --cpu-moe / --n-cpu-moe: these stay with the CPU wherever their layer goes
    for il in range(shape.n_layer):
        u = uses[slot(il)]
        u.layers.append(il)
        u.weights_bytes += shape.layer_bytes[il] - in_ram[il]
        uses[-1].weights_bytes += in_ram[il]
    for kl in plan.kv_layers:
        uses[slot(kl.layer)].kv_bytes += kl.k_bytes + kl.v_bytes
    rs_layer = plan.rs_bytes // len(shape.recurrent_layers) if shape.recurrent_layers else 0
    for il in shape.recurrent_layers:  # a recurrent layer's state lives on its layer's device (llama-memory-recurrent.cpp)
        uses[slot(il)].kv_bytes += rs_layer
    for i, u in enumerate(uses):
        per = [sum(kl.k_bytes + kl.v_bytes for kl in plan.kv_layers if slot(kl.layer) == i and kl.swa == swa) for swa in (False, True)]
        u.kv_by_cache = [b for b in per if b]
    out = uses[slot(shape.n_layer)]
    out.output_layer = True
    cpu_use = uses[-1]
    cpu_use.weights_bytes += shape.input_bytes
    if out is cpu_use:
        out.weights_bytes += shape.output_bytes  # a tied output reads token_embd in place
    else:
        out.weights_bytes += shape.output_bytes + shape.tied_bytes
    cpu_use.output_bytes = plan.output_bytes
    if header is not None:
        moe = {il for il, b in enumerate(in_ram) if b}
        cpu_use.mapped_bytes = cpu_mapped_span(header, set(cpu_use.layers), cpu_use.output_layer, moe)
    _compute(shape, cfg, plan, uses)
    rules = []
    if len(devices) > 1:
        rules.append(
            "layers split over the offload devices in proportion to their free memory (llama-model.cpp load_tensors), passed to llama.cpp as tensor_split"
        )
    if any(d.kind == "rpc" for d in devices):
        rules.append(
            "workers' devices first, then local GPUs (llama.cpp llama_prepare_model_devices); the token embeddings and the logits buffer stay on the CPU"
        )
        if out is not cpu_use and out.device.kind == "rpc":
            rules.append("the output layer is offloaded first (as to a GPU): every token's logits come back over the network")
    if any(in_ram):
        rules.append(experts_rule(sum(1 for b in in_ram if b), shape.n_layer, sum(in_ram)))
    if pipeline_parallel(len(devices), shape, cfg):
        rules.append("pipeline parallelism (llama-context.cpp: more than one device, all layers offloaded): each device keeps 4 copies of its inputs")
    return Placement(plan, uses, tuple(split), rules)


def experts_rule(n_layers: int, n_layer: int, n_bytes: int) -> str:
    """The sentence for experts kept in RAM (``--cpu-moe``/``--n-cpu-moe``)."""
    return (f"experts in RAM: those of {n_layers} of {n_layer} layers ({size(n_bytes)}, biases and scales included) stay in RAM and run "
            "on the CPU; attention, norms, router and shared experts go with their layer (llama.cpp's tensor-buffer overrides)")


def _q_live(shape: ModelShape, cfg: LoadConfig, cells: int) -> int:
    """Values per token of the Q-sized activation planner.compute_bytes counts
    live at the feed-forward peak (its ``q_live``), when that peak is the layer
    phase's largest; 0 otherwise. Mirrors planner.compute_bytes' terms."""
    T = min(cells, cfg.n_ubatch)
    t_out = min(T, cfg.n_outputs_max or cfg.n_batch)
    E = shape.n_embd
    F = max(shape.n_ff) if shape.n_ff else 4 * E
    H = max(shape.n_head) if shape.n_head else 1
    Hkv = max(shape.n_head_kv) if shape.n_head_kv else H
    q = H * shape.head_dim_k
    if is_quantized(cfg.type_k) and not shape.q_norm and not (t_out >= T and T >= cells):
        return 0
    ffn = 3 * F + 3 * E + q + 8
    kv = Hkv * (shape.head_dim_k + shape.head_dim_v)
    attn = 3 * E + q + kv + (H * shape.head_dim_v if cfg.uses_flash_attn else cells * H)
    return min(q, max(0, ffn - attn))


def cpu_mapped_span(header: GGUFHeader, cpu_layers: set[int], output_on_cpu: bool, moe_layers: frozenset[int] | set[int] = frozenset()) -> int:
    """What llama.cpp prints as ``CPU_Mapped model buffer size``: with mmap the
    CPU's weights are one mapping of the file from the first to the last byte of
    the tensors it keeps (llama-model-loader.cpp ``get_mapping_range``), so the
    tensors of offloaded layers that lie between count too (files often store
    blk.0, blk.1, blk.10, ...). Only the pages of the CPU's own tensors are read.
    ``moe_layers``: layers whose experts are kept in RAM (``--n-cpu-moe``): their
    expert tensors are the CPU's too, and usually stretch the mapping over most of the file."""
    spans: dict[int, tuple[int, int]] = {}  # per file of a split model: its own mapping
    exps = re.compile(FFN_EXPS_REGEX)
    for t in header.tensors:
        if t.name.startswith("blk."):
            il = int(t.name.split(".")[1])
            keep = il in cpu_layers or (il in moe_layers and exps.search(t.name) is not None)
        elif t.name.startswith("output"):
            keep = output_on_cpu
        else:
            keep = True
        if keep:
            lo, hi = spans.get(t.part, (t.offset, 0))
            spans[t.part] = (min(lo, t.offset), max(hi, t.offset + t.n_bytes))
    return sum(hi - lo for lo, hi in spans.values())


def pipeline_parallel(n_devices: int, shape: ModelShape, cfg: LoadConfig) -> bool:
    """llama-context.cpp: with more than one offload device and every layer
    offloaded (n_gpu_layers > n_layer), and devices with async compute and events
    (RPC devices have both), the scheduler keeps GGML_SCHED_MAX_COPIES (4) copies
    of each split's inputs, to overlap the devices' work."""
    n_all = shape.n_layer + 1
    ngl = n_all if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
    # ... and no tensor override (llama-context.cpp: !model.has_tensor_overrides()): experts in RAM turn it off
    return n_devices > 1 and ngl > shape.n_layer and cfg.n_cpu_moe == 0


SCHED_COPIES = 4  # ggml-backend.cpp GGML_SCHED_MAX_COPIES


def _compute(shape: ModelShape, cfg: LoadConfig, plan: MemoryPlan, uses: list[DeviceUse]) -> None:
    """Compute buffer per device: ggml_backend_sched gives each backend the peak
    of its own part of the worst-case graph (``n_ubatch`` tokens T, full cache).
    A model, fitted to llama.cpp's log on this machine (tests/test_rpc.py), in
    terms of planner.compute_bytes' layer phase P (no logits) and:

    - I, the inputs a device's part copies in: the attention masks (and the
      Hadamard matrices of a quantized cache) plus one n_embd x T f32 activation;
    - a device holding layers: P less the n_embd x T input activation the CPU
      holds instead, and, when some layers stay on the CPU, less the Q-sized
      activation planner.compute_bytes counts live at the feed-forward peak;
    - the device with the output layer: also the logits phase,
      t_out x (n_vocab + n_embd) f32;
    - the CPU with no layer: the input embeddings and I (2 n_embd x T + masks);
      with layers: P, as when it runs everything;
    - with pipeline parallelism (see ``pipeline_parallel``) every device keeps
      its inputs in 4 copies: P + 3 I, and the logits phase 4 I more.
    """
    cells, swa_cells = planner.kv_cells(shape, cfg)
    P = planner.compute_bytes(replace(shape, n_vocab=0), cfg, cells, swa_cells)
    T = min(cells, cfg.n_ubatch)
    t_out = min(T, cfg.n_outputs_max or cfg.n_batch)
    et = shape.n_embd * T * 4
    mask_bytes = 2 if cfg.uses_flash_attn else 4
    has_swa = bool(shape.swa_layers and shape.n_swa)
    full_mask, swa_mask = cells * T * mask_bytes, (swa_cells * T * mask_bytes if has_swa else 0)
    rot = planner.hadamard_bytes(shape, cfg)

    def masks(layers: list[int]) -> int:
        """The masks a device's layers read: a device with only sliding-window
        layers (or none) gets no full-attention mask, and the other way round."""
        swa = [il in shape.swa_layers for il in layers] if has_swa else [False] * len(layers)
        return (full_mask if not all(swa) else 0) + (swa_mask if any(swa) else 0)

    all_masks = full_mask + swa_mask
    logits = t_out * (shape.n_vocab + shape.n_embd) * 4
    offload = [u for u in uses if u.device.kind != "cpu"]
    cpu = uses[-1]
    if len(offload) == 1 and offload[0].device.kind == "gpu":
        # One local GPU: it has a host buffer type and offload_op, so the
        # scheduler moves the CPU layers' large batches to it too
        # (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur): the
        # worst-case graph's buffer is the GPU's whenever it holds a layer
        # or the output, as planner.plan_memory counts it.
        (offload[0] if plan.compute_on_gpu else cpu).compute_bytes = plan.compute_bytes
        return
    pp = pipeline_parallel(len(offload), shape, cfg)  # llama.cpp counts the model's devices, used or not
    copies = SCHED_COPIES if pp else 1
    for u in offload:
        if not (u.layers or u.output_layer):
            continue
        m = masks(u.layers) if u.layers else all_masks
        inputs = m + rot + et
        p_dev = P - all_masks + m
        if pp:
            layer = p_dev + (copies - 1) * inputs
        else:
            layer = p_dev - et - (_q_live(shape, cfg, cells) * T * 4 if cpu.layers else 0)
        out = logits + (copies * inputs if pp else 0)
        u.compute_bytes = max(layer if u.layers else 0, out if u.output_layer else 0)
    if cpu.layers:
        cpu.compute_bytes = P if not cpu.output_layer else planner.compute_bytes(shape, cfg, cells, swa_cells)
    else:
        cpu.compute_bytes = et + copies * (all_masks + rot + et)


# -- fitting the devices' budgets ------------------------------------------------------


def refereed(p: Placement, dry: DryRun, source: str) -> Placement:
    """``p`` with each device's compute buffer as llama.cpp's dry run logged it
    (``source`` names it). The CPU's counts its host buffers. Exact against a
    real load, except that under pipeline parallelism the dry run may reserve
    one n_embd x n_ubatch f32 input more, in its 4 copies, on a later device
    (SmolLM2 over two workers: 37.41 MiB where the load takes 32.91, 4 x 576 x
    512 x 4 bytes = 4.5 MiB; 2.00 MiB on 21 of the 180 synthetic RPC cases,
    n_embd 256). The cause is llama.cpp's: at full offload the graph callback
    pins each layer's "norm" and "l_last" to the layer's device
    (llama-context.cpp ``graph_get_cb``), and the dry run's
    ``ggml_backend_sched_reserve_size`` (ggml-backend.cpp) resets the
    scheduler after the graph is built, dropping those pins, so the norm runs
    on the previous device and both its output and the residual are copied
    in. The real load's ``ggml_backend_sched_reserve`` keeps them. So it errs
    high, never low."""
    uses = []
    for u in p.uses:
        if u.device.kind == "cpu":
            got = dry.total("compute", cpu=True)
        else:
            got = dry.buffers.get(u.device.name, {}).get("compute")
        uses.append(replace(u, compute_bytes=got, compute_source=source) if got is not None else replace(u))
    return replace(p, uses=uses)


def fits(p: Placement, ram: int | None) -> bool:
    """Every offload device keeps ``planner.default_margin`` of its free memory
    free, and the CPU's share fits the RAM available."""
    return _fits(p, ram)


def _fits(p: Placement, ram: int | None) -> bool:
    for u in p.uses:
        if not u.total_bytes:
            continue  # a device given nothing needs no head-room either
        if u.device.kind == "cpu":
            if ram is not None and u.total_bytes > ram:
                return False
        elif u.device.free_bytes is not None and u.total_bytes > u.device.free_bytes - planner.default_margin(u.device.free_bytes):
            return False
    return True


def _max_ctx(shape: ModelShape, cfg: LoadConfig, devices: list[Device], cpu: Device, ram: int | None, limit: int) -> int:
    return planner.largest_ctx(lambda c: _fits(place(shape, c, devices, cpu), ram), cfg, limit)


def fit_across(
    shape: ModelShape,
    want: LoadConfig,
    devices: list[Device],
    cpu: Device,
    *,
    ram: int | None,
    policy: str = "ctx",
    kv_fixed: bool = False,
    ngl_fixed: bool = False,
    ctx_limit: int | None = None,
    header: GGUFHeader | None = None,
    moe_fixed: bool = False,
    ctx_first: bool = False,
) -> tuple[planner.FitResult, Placement]:
    """The one fit, over any set of devices: none (the CPU alone), one local
    GPU, or RPC workers' devices (and a local GPU). Cheaper cache types first,
    then fewer offloaded layers (policy ``offload``) or a smaller context
    (``ctx``): ``planner.search``. ``policy='ctx'`` keeps every layer offloaded
    and gives up context; settings the user fixed are not changed. Each offload
    device must keep planner.default_margin of its free memory free; the CPU's
    share must fit the RAM available. ``ctx_first``: the context is a default
    nobody named, which gives way first (``planner.search``)."""
    limit = ctx_limit or max(want.n_ctx, planner.MIN_CTX)
    ladder = planner.kv_ladder(shape, want, kv_fixed)
    n_all = shape.n_layer + 1
    experts, steps = moe.offload_steps(shape.n_layer, shape.layer_expert_bytes is not None, want, gpu=bool(devices), ngl_fixed=ngl_fixed,
                                       moe_fixed=moe_fixed)
    local = [d.kind for d in devices] == ["gpu"]

    def ok(cfg: LoadConfig) -> bool:
        return _fits(place(shape, cfg, devices, cpu), ram)

    chosen = want if ok(want) else planner.search(want, ladder, steps, policy, kv_fixed, ok, experts, ctx_first=ctx_first)
    fits = chosen is not None
    cfg = chosen or want
    p = place(shape, cfg, devices, cpu, header=header)
    if not fits:
        smallest = planner.replace_config(want, n_ctx=planner.CTX_PAD, type_k=ladder[-1], type_v=ladder[-1],
                           n_gpu_layers=0 if devices and not ngl_fixed else want.n_gpu_layers)
        reason = _why_not(place(shape, want, devices, cpu), place(shape, smallest, devices, cpu), ram)
    elif cfg == want:
        reason = "fits as asked"
    elif local and cfg.n_gpu_layers == 0:
        one = place(shape, planner.replace_config(cfg, n_gpu_layers=1), devices, cpu).uses[0]
        free = devices[0].free_bytes or 0
        reason = (
            f"the GPU budget ({size(free)} less {size(planner.default_margin(free))} head-room) is too small for even one layer "
            f"(the first to go, the output layer, with the compute buffer needs {size(one.total_bytes)}): running on the CPU"
        )
    else:
        reason = planner.describe_change(want, cfg, n_all, "on the GPU" if local or not devices else "offloaded")
    budgets = [d.free_bytes for d in devices if d.free_bytes is not None]
    table = planner.LazyTable(lambda: {t: _max_ctx(shape, planner.replace_config(cfg, type_k=t, type_v=t), devices, cpu, ram, limit)
                                       for t in planner.KV_LADDER if planner.cache_types_allowed(shape, planner.replace_config(cfg, type_k=t, type_v=t))})
    result = planner.FitResult(
        fits,
        cfg,
        p.plan,
        (budgets[0] if len(budgets) == 1 else sum(budgets)) if budgets else None,  # one budget keeps the unit it was typed in
        ram,
        sum(planner.default_margin(b) for b in budgets),
        reason,
        [] if cfg == want else [reason],
        table,
    )
    return result, p


def _why_not(first: Placement, smallest: Placement, ram: int | None) -> str:
    """Why nothing fits, from the placement asked (``first``) and the one at the
    smallest settings (every layer on the CPU, the smallest context and cache
    type): the devices over their budget, the fix named."""
    plan = smallest.plan
    over = [u for u in smallest.uses if not _fits(replace(smallest, uses=[u]), ram)]
    gpus = [u for u in over if u.device.kind != "cpu"]
    local = [u.device.kind for u in smallest.uses[:-1]] == ["gpu"]

    def needs(u: DeviceUse) -> str:
        free = u.device.free_bytes or 0
        return (f"{'the GPU' if local else u.device.name} needs {size(u.total_bytes)}, budget {_free(u.device.free_bytes)} "
                f"minus {size(planner.default_margin(free))} head-room")

    if gpus:
        return f"even with every layer on the CPU, a {plan.n_ctx}-token context and a {plan.type_k} cache " + ", ".join(map(needs, gpus))
    if len(over) == 1:
        return f"needs {size(over[0].total_bytes)} of RAM at the smallest settings, {_free(ram)} available: a smaller quant is needed"
    return "; ".join(needs(u) for u in first.uses[:-1] if not _fits(replace(first, uses=[u]), ram)) or "does not fit"


def logged_buffers(lines: list[str]) -> dict[str, dict[str, list[float]]]:
    """llama.cpp's allocation lines ('RPC0[host:port] model buffer size = 92.10 MiB',
    'CPU_Mapped model buffer size', 'KV buffer size', 'compute buffer size',
    'output buffer size') by device and kind, in MiB as printed. The CPU's buffer
    types (CPU, CPU_Mapped, CPU_REPACK, CPU_Host) are the CPU's."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, kind, mib in buffer_lines(lines):
        dev = "CPU" if name.startswith("CPU") else name
        out.setdefault(dev, {}).setdefault(kind, []).append(mib)
    return out


def rpc_devices(endpoints: Sequence[Any], hw: Any, local_gpu: Callable[[], bool]) -> tuple[list[Device], Device]:
    """With --rpc: probe every worker (one line and exit 1 for one that is down,
    before anything loads); the devices to fit layers across are the workers',
    a local GPU's and the CPU. ``local_gpu`` asks the engine whether this build
    sees a GPU, where only a typed --vram says there is one."""
    found = probe_all(list(endpoints))
    devices = [Device(d.name, "rpc", d.free_bytes, d.total_bytes) for w in found for d in w.devices]
    if hw.gpu_source in ("nvml", "apple-unified") or (hw.gpu_source == "--vram" and local_gpu()):
        devices.append(Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes))
    cpu = Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
    return devices, cpu
