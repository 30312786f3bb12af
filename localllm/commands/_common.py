"""Helpers the model-loading commands share: options -> load config, and the
fitting service (``localllm.plan.fitting``) asked with them."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from localllm.engine_api import Engine
from localllm.engine_api.config import LoadConfig
from localllm.engine_api.llama_rules import flash_attn_mode
from localllm.plan import fitting
from localllm.plan.hardware import Hardware


def load_config(args: argparse.Namespace, n_ctx: int) -> LoadConfig:
    """The load settings the options ask for. A quantized V cache turns flash
    attention on (``llama_rules.needs_flash_attn``), saying so when it was off;
    the physical batch is never above the logical one (``LoadConfig``)."""
    kv = args.kv_type or "f16"
    type_v = args.v_type or kv
    flash = flash_attn_mode(args.flash_attn, type_v)
    if flash != args.flash_attn and args.flash_attn == "off":
        say(f"a quantized V cache ({type_v}) needs flash attention: turning it on")
    return LoadConfig(
        n_ctx=n_ctx,
        n_threads=args.threads,
        n_gpu_layers=-1 if args.ngl is None else args.ngl,
        flash_attn=flash,
        type_k=args.k_type or kv,
        type_v=type_v,
        n_batch=args.batch,
        n_ubatch=args.ubatch,
        swa_full=args.swa_full,
        rpc_servers=tuple(str(ep) for ep in (getattr(args, "rpc", None) or ())),
    )


def fit_request(args: argparse.Namespace, n_ctx: int) -> fitting.Request:
    """What the options fix: the config, the cache types and GPU layers the user
    named (kept), and the policy."""
    return fitting.Request(
        load_config(args, n_ctx),
        kv_fixed=bool(args.kv_type or args.k_type or args.v_type),
        ngl_fixed=args.ngl is not None,
        policy=getattr(args, "policy", "ctx"),
    )


@dataclass
class Fitted:
    fit: fitting.Fit
    hardware: Hardware

    @property
    def config(self) -> LoadConfig:
        return self.fit.config

    @property
    def placement(self):  # placement.Placement, with --rpc: per device
        return self.fit.placement

    @property
    def shift_extra_bytes(self) -> int | None:
        return self.fit.shift_extra_bytes


def fit_config(args: argparse.Namespace, path: Path, n_ctx: int | None, *, n_seq: int = 1) -> Fitted:
    """Fit the options to the GPU budget (detected or --vram) and RAM: the
    settings that fit, the user's explicit choices kept.

    ``n_seq`` > 1 plans serve's batch engine as it loads: one unified cache for
    ``n_seq`` sequences and one row of logits per sequence (n_outputs_max)."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.modelfile.model_info import describe
    from localllm.plan import hardware

    header = read_header(path)
    trained = describe(header).context_length
    request = fit_request(args, n_ctx or fitting.default_ctx(trained))
    if n_seq > 1:
        request = replace(request, config=replace(request.config, n_seq=n_seq, n_outputs_max=n_seq, kv_unified=True))
    hw = hardware.detect(getattr(args, "vram", None))
    budget = fitting.Budget.of(hw)
    if getattr(args, "rpc", None):
        devices, cpu = rpc_devices(args.rpc, hw)
        return Fitted(fitting.fit_header(header, request, budget, devices=devices, cpu=cpu), hw)
    return Fitted(fitting.fit_header(header, request, budget), hw)


def rpc_devices(endpoints, hw):
    """With --rpc: probe every worker (one line and exit 1 for one that is down,
    before anything loads); the devices to fit layers across are the workers',
    a local GPU's and the CPU."""
    from localllm.plan import placement, workers

    workers = workers.probe_all(endpoints)
    devices = [placement.Device(d.name, "rpc", d.free_bytes, d.total_bytes) for w in workers for d in w.devices]
    if hw.gpu_source in ("nvml", "apple-unified") or (hw.gpu_source == "--vram" and _has_local_gpu()):
        devices.append(placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes))
    cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
    return devices, cpu


def _has_local_gpu() -> bool:
    from localllm.engine import rpc

    return bool(rpc.local_gpus())


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
    from localllm.util.fmt import safe  # names and paths come from files and servers

    print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)


def placement_for(fitted: Fitted, path: Path, cfg: LoadConfig):
    """The per-device placement of ``cfg`` (the fitted settings, perhaps with more
    rows of logits), over the devices and split the fit chose; None without --rpc."""
    pl = fitted.placement
    if pl is None:
        return None
    if cfg == fitted.config:
        return pl
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import placement, planner

    header = read_header(path)
    shape = planner.ModelShape.from_header(header)
    return placement.place(shape, cfg, [u.device for u in pl.uses[:-1]], pl.uses[-1].device, list(pl.split), header=header)


def device_table(fitted: Fitted, path: Path, logged: dict | None = None) -> list[dict]:
    """Per device (workers' devices, a local GPU, the CPU): the planned weights,
    KV, compute and output bytes and the free memory; with ``logged`` (the engine's
    ``logged_buffers``) also what llama.cpp printed for each, in MiB."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import placement, planner

    pl = fitted.placement
    if pl is None:
        header = read_header(path)
        shape = planner.ModelShape.from_header(header)
        hw = fitted.hardware
        devices = [placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes)] if hw.gpu_budget is not None else []
        cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
        pl = placement.place(shape, fitted.config, devices, cpu, header=header)
    rows = pl.to_list()
    for r in rows:
        r["logged_mib"] = (logged or {}).get(r["name"]) if logged is not None else None
    return rows
