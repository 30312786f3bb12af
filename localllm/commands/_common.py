"""Helpers the model-loading commands share: options -> load config, and auto-fit."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from localllm.backend import LoadConfig, run_config
from localllm.engine_api import Engine


def load_config(args: argparse.Namespace, n_ctx: int) -> LoadConfig:
    """The load settings the options ask for. The batch is never below 1 nor
    above the context (llama.cpp's own clamp), and the physical batch never
    above the logical one."""
    kv = args.kv_type or "f16"
    flash = args.flash_attn
    type_v = args.v_type or kv
    if type_v not in ("f32", "f16", "bf16") and flash != "on":
        if flash == "off":
            say(f"a quantized V cache ({type_v}) needs flash attention: turning it on")
        flash = "on"
    return LoadConfig(
        n_ctx=n_ctx,
        n_threads=args.threads,
        n_gpu_layers=-1 if args.ngl is None else args.ngl,
        flash_attn=flash,
        type_k=args.k_type or kv,
        type_v=type_v,
        n_batch=args.batch,
        n_ubatch=min(args.ubatch, args.batch),
        swa_full=args.swa_full,
        rpc_servers=tuple(str(ep) for ep in (getattr(args, "rpc", None) or ())),
    )


@dataclass
class Fitted:
    config: LoadConfig
    fit: object  # planner.FitResult
    hardware: object  # hardware.Hardware
    trained_ctx: int
    shift_extra_bytes: int | None  # what a shiftable (full-size SWA) cache costs more; None if it shifts already
    placement: object = None  # placement.Placement, with --rpc: per device


def fit_config(args: argparse.Namespace, path: Path, n_ctx: int | None) -> Fitted:
    """Plan the load against the GPU budget (detected or --vram) and RAM, and
    return the settings that fit. The user's explicit choices are kept."""
    from localllm import hardware, planner
    from localllm.gguf_file import read_header
    from localllm.model_info import describe

    header = read_header(path)
    info = describe(header)
    shape = planner.ModelShape.from_header(header)
    want = load_config(args, n_ctx or min(info.context_length or 4096, 4096))
    hw = hardware.detect(getattr(args, "vram", None))
    placement = None
    if getattr(args, "rpc", None):
        result, placement = _fit_rpc(args, shape, run_config(want), hw, max(want.n_ctx, info.context_length or 0), header)
    else:
        result = planner.fit(
            shape,
            run_config(want),
            gpu_budget=hw.gpu_budget,
            ram=hw.ram_available_bytes,
            policy=getattr(args, "policy", "ctx"),
            kv_fixed=bool(args.kv_type or args.k_type or args.v_type),
            ngl_fixed=args.ngl is not None,
            ctx_limit=max(want.n_ctx, info.context_length or 0),
        )
    c = result.config
    chosen = LoadConfig(
        n_ctx=c.n_ctx,
        n_threads=want.n_threads,
        n_gpu_layers=c.n_gpu_layers,
        flash_attn=want.flash_attn,
        type_k=c.type_k,
        type_v=c.type_v,
        n_batch=want.n_batch,
        n_ubatch=want.n_ubatch,
        swa_full=want.swa_full,
        n_outputs_max=want.n_outputs_max,
        rpc_servers=want.rpc_servers,
        tensor_split=placement.split if placement is not None else (),
    )
    extra = None
    if shape.swa_layers and shape.n_swa and not c.swa_full:
        full = planner.plan_memory(shape, planner.replace_config(c, swa_full=True), gpu=hw.gpu_budget is not None)
        extra = full.kv_cache_bytes - result.plan.kv_cache_bytes
    return Fitted(chosen, result, hw, info.context_length, extra, placement)


def _fit_rpc(args: argparse.Namespace, shape, want, hw, ctx_limit: int, header):
    """With --rpc: probe every worker (one line and exit 1 for one that is down,
    before anything loads), then fit layers across the workers' devices, a local
    GPU and the CPU."""
    from localllm import placement, rpc

    workers = rpc.probe_all(args.rpc)
    devices = [placement.Device(d.name, "rpc", d.free_bytes, d.total_bytes) for w in workers for d in w.devices]
    if hw.gpu_source in ("nvml", "apple-unified") or (hw.gpu_source == "--vram" and _has_local_gpu()):
        devices.append(placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes))
    cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
    return placement.fit_across(
        shape,
        want,
        devices,
        cpu,
        ram=hw.ram_available_bytes,
        policy=getattr(args, "policy", "ctx"),
        kv_fixed=bool(args.kv_type or args.k_type or args.v_type),
        ngl_fixed=args.ngl is not None,
        ctx_limit=ctx_limit,
        header=header,
    )


def _has_local_gpu() -> bool:
    from localllm import engine_rpc

    return bool(engine_rpc.local_gpus())


def apply_template(backend: Engine, args: argparse.Namespace) -> None:
    """``--template FILE|NAME`` (run, chat): the chat template to use instead of the model's."""
    spec = getattr(args, "template", None)
    if spec is None:
        return
    if getattr(args, "raw", False):
        from localllm.errors import UsageError

        raise UsageError("--raw uses no chat template: drop --template, or drop --raw")
    backend.use_template(spec)


def say(msg: str) -> None:
    from localllm.fmt import safe  # names and paths come from files and servers

    print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)


def device_table(fitted: Fitted, path: Path, logged: dict | None = None) -> list[dict]:
    """Per device (workers' devices, a local GPU, the CPU): the planned weights,
    KV, compute and output bytes and the free memory; with ``logged`` (the engine's
    ``logged_buffers``) also what llama.cpp printed for each, in MiB."""
    from localllm import placement, planner
    from localllm.backend import run_config
    from localllm.gguf_file import read_header

    pl = fitted.placement
    if pl is None:
        header = read_header(path)
        shape = planner.ModelShape.from_header(header)
        hw = fitted.hardware
        devices = [placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes)] if hw.gpu_budget is not None else []
        cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
        pl = placement.place(shape, run_config(fitted.config), devices, cpu, header=header)
    rows = pl.to_list()
    for r in rows:
        r["logged_mib"] = (logged or {}).get(r["name"]) if logged is not None else None
    return rows
