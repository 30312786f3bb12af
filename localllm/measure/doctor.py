"""``localllm doctor``: the seeds' checklist for "the model is slow", measured.

1. input size (prompt tokens); 2. TTFT; 3. ITL; 4. the KV cache's share of
memory and the concurrency it leaves; 5. quantization headroom; 6. engine
settings. It names the bottleneck from the measurements (prefill, compute-bound;
or decode, memory-bound), puts decode against its roofline, and ranks the
actions by their expected effect.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from localllm.engine_api import Engine, GenerationStats, LoadConfig, LoadInfo, SamplingConfig
from localllm.measure.diagnose import verdict
from localllm.measure.roofline import Roofline, roofline
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.modelfile.model_info import describe
from localllm.plan import planner
from localllm.plan.hardware import Hardware, physical_cores
from localllm.util.units import format_size as fmt_bytes

Q4_K_M_BPW = 4.89  # bits per weight llama.cpp's Q4_K_M lands on for dense models


@dataclass
class Action:
    action: str
    expected: str
    why: str
    gain: float  # expected speed-up factor of the bottleneck phase, for ranking
    # where the gain comes from: "measured" (on this machine, this prompt),
    # "derived" (arithmetic on the file and the plan: bytes read per token), or
    # "rule of thumb" (a typical figure, not measured here)
    basis: str = "rule of thumb"


@dataclass
class DoctorReport:
    bottleneck: str
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    bandwidth_gb_per_s: float  # the CPU's, measured with the decode's thread count
    bytes_per_token: int
    decode_ceiling_tokens_per_s: float | None  # None: the GPU's bandwidth is unknown
    decode_efficiency: float | None
    kv_cache_bytes: int
    kv_share_of_memory: float
    concurrency_at_full_context: int
    file_type: str
    bits_per_weight: float
    speculative_gain: float | None = None  # measured tokens/s with prompt-lookup drafts over without
    speculative_acceptance: float | None = None
    bandwidth_by_threads_gb_per_s: dict[int, float] = field(default_factory=dict)
    gpu_bandwidth_gb_per_s: float | None = None  # None: no GPU, or none we know the figure of
    gpu_bytes_per_token: int = 0  # of bytes_per_token, what offloaded layers read from GPU memory
    settings: dict[str, Any] = field(default_factory=dict)
    kv_types: dict[str, dict[str, Any]] = field(default_factory=dict)  # per cache type: largest context that fits, measured KL
    contention: dict[str, Any] | None = None  # the machine's load before the measurement (measure.starved.Contention); None: not measured
    decode_by_threads_tokens_per_s: dict[int, float] = field(default_factory=dict)  # measured side by side (measure.thread_counts)
    tune: dict[str, Any] | None = None  # whether localllm tune measured this model here ("tuned": its record, or null) and the advice
    verdict: str = ""
    actions: list[Action] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def weights_read_per_token(shape: planner.ModelShape) -> int:
    """The planner's count (a MoE layer reads only its routed experts)."""
    return planner.weights_read_per_token(shape)


def gpu_weights_read_per_token(shape: planner.ModelShape, plan: planner.MemoryPlan, gpu: bool) -> int:
    """The planner's count (``planner.gpu_read_per_token``)."""
    return planner.gpu_read_per_token(shape, plan, gpu)


def examine(
    header: GGUFHeader,
    info: LoadInfo,
    cfg: LoadConfig,
    stats: GenerationStats,
    hw: Hardware,
    bandwidth: float,
    kv_q8_kl: float | None,
    spec: tuple[float | None, float | None] | None = None,
    *,
    gpu_bandwidth: float | None = None,
    bandwidth_by_threads: dict[int, float] | None = None,
    placement=None,
) -> DoctorReport:
    """``bandwidth``: the CPU's, measured with the decode's threads;
    ``gpu_bandwidth``: the GPU's (hardware.gpu_memory_bandwidth), for the bytes
    the offloaded layers read. ``placement`` (placement.Placement, with --rpc):
    the layers per device, which the figures and the advice then follow instead
    of the local GPU alone."""
    shape = planner.ModelShape.from_header(header)
    model = describe(header)
    if placement is not None:
        plan = placement.plan
        gpu = plan.n_gpu_layers > 0
        if any(u.device.kind == "rpc" and (u.layers or u.output_layer) for u in placement.uses):
            gpu_bandwidth = None  # a worker's device reads its layers at a bandwidth we cannot measure from here
    else:
        gpu = hw.gpu_budget is not None and info.gpu_offload_supported
        plan = planner.plan_memory(shape, cfg, gpu=gpu)
    kv_now = planner.kv_bytes_in_use(plan, stats.context_used)
    gpu_share = plan.kv_gpu_bytes / plan.kv_cache_bytes if plan.kv_cache_bytes else 0.0
    gpu_read = gpu_weights_read_per_token(shape, plan, gpu) + int(kv_now * gpu_share)
    rf: Roofline = roofline(
        bandwidth,
        weights_read_per_token(shape),
        kv_now,
        stats.decode_tokens_per_s or None,
        gpu_bytes=gpu_read,
        gpu_bandwidth=gpu_bandwidth,
    )
    weights = plan.weights_gpu_bytes + plan.weights_cpu_bytes
    total = weights + plan.kv_cache_bytes + plan.compute_bytes + plan.output_bytes
    budget = hw.gpu_budget if gpu else hw.ram_available_bytes
    free_for_kv = (budget or 0) - weights - plan.compute_bytes - plan.output_bytes
    concurrency = max(int(free_for_kv // plan.kv_cache_bytes), 0) if plan.kv_cache_bytes else 0
    if placement is not None:
        concurrency = _concurrency(placement, hw.ram_available_bytes)
    v = verdict(stats, rf.ceiling_tokens_per_s)
    physical = _physical_cores()
    settings = {
        "flash_attn": info.flash_attn,
        "n_batch": cfg.n_batch,
        "n_ubatch": cfg.n_ubatch,
        "n_ctx": info.n_ctx,
        "type_k": cfg.type_k,
        "type_v": cfg.type_v,
        "n_gpu_layers": plan.n_gpu_layers,
        "gpu_offload_supported": info.gpu_offload_supported,
        "threads": info.n_threads,
        "physical_cores": physical,
    }
    if placement is not None:
        settings["devices"] = [
            {
                "name": u.device.name,
                "kind": u.device.kind,
                "layers": len(u.layers),
                "output_layer": u.output_layer,
                "total_bytes": u.total_bytes,
                "free_bytes": u.device.free_bytes if u.device.kind != "cpu" else hw.ram_available_bytes,
            }
            for u in placement.uses
        ]
    report = DoctorReport(
        bottleneck=v.bottleneck if v else "decode",
        prompt_tokens=stats.prompt_tokens,
        generated_tokens=stats.generated_tokens,
        ttft_ms=stats.ttft_ms,
        itl_p50_ms=stats.itl_ms.p50,
        itl_p95_ms=stats.itl_ms.p95,
        prefill_tokens_per_s=stats.prefill_tokens_per_s,
        decode_tokens_per_s=stats.decode_tokens_per_s,
        bandwidth_gb_per_s=bandwidth / 1e9,
        bytes_per_token=rf.bytes_per_token,
        decode_ceiling_tokens_per_s=rf.ceiling_tokens_per_s,
        decode_efficiency=rf.efficiency,
        kv_cache_bytes=plan.kv_cache_bytes,
        kv_share_of_memory=plan.kv_cache_bytes / total if total else 0.0,
        concurrency_at_full_context=concurrency,
        file_type=model.file_type,
        bits_per_weight=model.bits_per_weight,
        settings=settings,
        verdict=v.text if v else "",
        speculative_gain=spec[0] if spec else None,
        speculative_acceptance=spec[1] if spec else None,
        bandwidth_by_threads_gb_per_s={n: b / 1e9 for n, b in (bandwidth_by_threads or {}).items()},
        gpu_bandwidth_gb_per_s=gpu_bandwidth / 1e9 if gpu_bandwidth else None,
        gpu_bytes_per_token=rf.gpu_bytes_per_token,
    )
    report.actions = _actions(report, shape, plan, rf, kv_now, kv_q8_kl)[:3]
    return report


def _concurrency(placement, ram: int | None) -> int:
    """More full-context sequences the devices' memory would hold: each needs its
    share of the KV cache on every device that holds KV, so the tightest device
    decides (its free memory, less the head-room, less what this load uses)."""
    counts = []
    for u in placement.uses:
        if not u.kv_bytes:
            continue
        free = ram if u.device.kind == "cpu" else u.device.free_bytes
        if free is None:
            continue
        room = free - (planner.default_margin(free) if u.device.kind != "cpu" else 0) - u.total_bytes
        counts.append(max(room // u.kv_bytes, 0))
    return int(min(counts)) if counts else 0


def _physical_cores() -> int:
    return physical_cores()


def _actions(r: DoctorReport, shape: planner.ModelShape, plan: planner.MemoryPlan, rf: Roofline, kv_now: int, kl: float | None) -> list[Action]:
    s = r.settings
    out: list[Action] = []
    w = weights_read_per_token(shape)
    if r.bottleneck == "decode":
        if r.bits_per_weight > Q4_K_M_BPW + 0.5:
            w4 = int(w * Q4_K_M_BPW / r.bits_per_weight)
            gain = (w + kv_now) / (w4 + kv_now)
            out.append(
                Action(
                    f"use a Q4_K_M file (localllm quantize --type Q4_K_M, from an F16 source) instead of {r.file_type}",
                    f"decode ceiling x{gain:.2f} ({fmt_bytes(w + kv_now)} -> {fmt_bytes(w4 + kv_now)} read per token)",
                    "decode is memory-bound: fewer bits per weight, fewer bytes per token",
                    gain,
                    "derived",
                )
            )
        if s["type_k"] == "f16" and kv_now:
            gain = (w + kv_now) / (w + kv_now // 2)
            cost = f"measured mean KL {kl:.4f} against f16" if kl is not None else "quality cost: see scripts/kv_cache_quality.py"
            out.append(
                Action(
                    "--kv-type q8_0 (a quantized KV cache)",
                    f"KV read per token halves (x{gain:.2f} at this length, more at long contexts); {cost}",
                    f"the KV cache is {100 * kv_now / (w + kv_now):.0f}% of the bytes read per token now and {fmt_bytes(plan.kv_cache_bytes)} at full context",
                    gain,
                    "derived",
                )
            )
        if r.decode_efficiency is not None and r.decode_efficiency < 0.5:
            out.append(
                Action(
                    f"check threads ({s['threads']}, {s['physical_cores']} physical cores) and other load on the machine",
                    f"decode runs at {100 * r.decode_efficiency:.0f}% of its {r.decode_ceiling_tokens_per_s:.0f} t/s ceiling",
                    "far below the memory roofline, the bottleneck is not bandwidth: compute, threads or contention",
                    1 / max(r.decode_efficiency, 0.05) ** 0.5,
                    "rule of thumb",
                )
            )
    else:
        out.append(
            Action(
                "shorten the prompt, or keep it as a chat prefix (localllm chat reuses the cached history each turn)",
                f"TTFT scales with the {r.prompt_tokens} prompt tokens: {r.ttft_ms:.0f} ms now",
                "prefill is compute-bound: every prompt token costs a pass through the model",
                2.0,
            )
        )
        if s["n_ubatch"] < 512:
            out.append(Action("--ubatch 512 --batch 512", "bigger matrix multiplies in prefill", "small physical batches waste compute", 1.3))
        if s["flash_attn"] == "off":
            out.append(Action("--flash-attn on", "less memory traffic in attention over long prompts", "flash attention is off", 1.2))
    if r.bottleneck == "decode" and r.speculative_gain is not None and r.speculative_gain >= 1.05:
        out.append(
            Action(
                "--speculate lookup (draft from the text always; auto, the default, drafts while drafts pay)",
                f"measured x{r.speculative_gain:.2f} tokens/s on this prompt ({100 * (r.speculative_acceptance or 0):.0f}% of drafts accepted)",
                "the reply repeats the prompt, so drafts from it are often right",
                r.speculative_gain,
                "measured",
            )
        )
    if "devices" in s:
        out.extend(_offload_over_devices(s, shape))
    elif s["gpu_offload_supported"] and s["n_gpu_layers"] < shape.n_layer + 1:
        out.append(
            Action(
                f"offload more layers (--ngl, now {s['n_gpu_layers']} of {shape.n_layer + 1})",
                "GPU memory bandwidth and compute are several times the CPU's",
                "layers are running on the CPU",
                3.0,
            )
        )
    if s["threads"] != s["physical_cores"]:
        out.append(
            Action(
                f"--threads {s['physical_cores']}",
                "llama.cpp scales with physical cores, not hyper-threads",
                f"threads {s['threads']} vs {s['physical_cores']} physical cores",
                1.1,
            )
        )
    if not out:
        eff = "n/a" if r.decode_efficiency is None else f"{100 * r.decode_efficiency:.0f}%"
        out.append(Action("nothing obvious to change", f"decode at {eff} of its roofline", "already near the limit", 1.0, "measured"))
    return sorted(out, key=lambda a: -a.gain)


def _offload_over_devices(s: dict[str, Any], shape: planner.ModelShape) -> list[Action]:
    """With --rpc: offloading more layers is advised only when the CPU still
    holds some and a device of the placement (a worker's, or a local GPU) has
    room for at least one more, and it names that device, never a GPU this
    machine does not have."""
    devices = s["devices"]
    cpu = devices[-1]
    if not cpu["layers"]:
        return []
    layer = max(shape.layer_bytes) if shape.layer_bytes else 0
    room = [d for d in devices[:-1] if d["free_bytes"] is not None and d["free_bytes"] - planner.default_margin(d["free_bytes"]) - d["total_bytes"] > layer]
    if not room:
        return []
    names = ", ".join(d["name"] for d in room)
    remote = any(d["kind"] == "rpc" for d in room)
    return [
        Action(
            f"offload more layers to {names} (--ngl, now {s['n_gpu_layers']} of {shape.n_layer + 1})",
            f"{cpu['layers']} layers run on this machine's CPU; {names} has room for more"
            + (" (each token then also waits for the network round trips to the workers)" if remote else ""),
            "layers run on the CPU while a device of the placement has free memory",
            1.5 if remote else 3.0,
        )
    ]


def measure(backend: Engine, prompt: str, *, gen_tokens: int = 64, chat: bool = True) -> GenerationStats:
    """Warm up, then one timed generation (greedy, a fixed length)."""
    backend.stream("Hello", SamplingConfig(temperature=0, max_tokens=4, ignore_eos=True), chat=chat).drain()
    return backend.stream(prompt, SamplingConfig(temperature=0, max_tokens=gen_tokens, ignore_eos=True), chat=chat).drain()


def measure_speculation(backend: Engine, prompt: str, *, gen_tokens: int, chat: bool) -> tuple[float | None, float | None]:
    """(tokens/s with n-gram drafts ÷ without, acceptance), greedy, on ``prompt``
    (``localllm.speculation``, always drafting). Needs a context loaded with rows
    of logits for the drafts (``speculation.rows``)."""

    tokens = backend.prompt_tokens(prompt, chat=chat)
    plain = backend.stream(tokens, SamplingConfig(temperature=0, max_tokens=gen_tokens, ignore_eos=True, speculate="none")).drain().tpot_ms
    run = backend.stream(tokens, SamplingConfig(temperature=0, max_tokens=gen_tokens, ignore_eos=True, speculate="lookup"))
    spec = run.drain().tpot_ms
    return (plain / spec if spec and plain else None), run.spec.acceptance if run.spec is not None else None
