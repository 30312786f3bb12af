"""Helpers the model-loading commands share: the flags -> a ``runtime.LoadRequest``,
and the load path (``localllm.runtime``: the fitting service, then the load)
asked with it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from localllm import runtime
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import UsageError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.modelfile.lora import AdapterSpec, read_adapter, specs_from_flags
from localllm.plan import fitting, placement, planner
from localllm.plan.prepare import LoadPlan
from localllm.store import first_use
from localllm.util.fmt import safe


def load_options(args: argparse.Namespace, n_ctx: int | None) -> fitting.LoadOptions:
    """The load options the flags give (``fitting.LoadOptions``, the shape the
    cockpit's settings take too): ``--kv-type`` sets both cache types,
    ``--k-type``/``--v-type`` one each; ``n_ctx`` None: the plan decides."""
    return fitting.LoadOptions(
        n_ctx=n_ctx, threads=args.threads, n_gpu_layers=args.ngl, type_k=args.k_type or args.kv_type,
        type_v=args.v_type or args.kv_type, flash_attn=args.flash_attn, swa_full=args.swa_full, n_batch=args.batch,
        n_ubatch=args.ubatch, policy=getattr(args, "policy", "ctx"),
        rpc_servers=tuple(str(ep) for ep in (getattr(args, "rpc", None) or ())), n_cpu_moe=getattr(args, "n_cpu_moe", None),
    )


def load_config(args: argparse.Namespace, n_ctx: int | None) -> LoadConfig:
    """The load settings the options ask for, saying so when a quantized V
    cache turns flash attention on against --flash-attn off."""
    cfg = load_options(args, n_ctx).config()
    if cfg.flash_attn != args.flash_attn and args.flash_attn == "off":
        say(f"a quantized V cache ({cfg.type_v}) needs flash attention: turning it on")
    return cfg


def sampling_config(args: argparse.Namespace, *, ignore_eos: bool = False) -> SamplingConfig:
    """The sampling the flags ask for (``cli._add_sampling``: each already in range)."""
    return SamplingConfig(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, seed=args.seed, max_tokens=args.n_predict, ignore_eos=ignore_eos)


def fit_request(args: argparse.Namespace, n_ctx: int | None) -> fitting.Request:
    """What the options fix: the config, the cache types and GPU layers the user
    named (kept), the policy, and the LoRA adapters to count (``--lora``)."""
    load_config(args, n_ctx)  # says when flash attention was turned on
    return replace(load_options(args, n_ctx).request(), adapters=tuple(read_adapter(s.path) for s in lora_specs(args)))


def lora_specs(args: argparse.Namespace) -> list[AdapterSpec]:
    """``--lora``/``--lora-scaled`` in the order given (an adapter's id is its
    place), each at scale 0 with ``--lora-init-without-apply``. A flag without
    an adapter is a usage error."""
    return specs_from_flags(getattr(args, "lora", None), bool(getattr(args, "lora_init_without_apply", False)))


Fitted = LoadPlan  # what the loading commands get: the fit, the hardware, the refereed figures


def load_request(args: argparse.Namespace, path: Path, n_ctx: int | None, *, n_seq: int = 1, serving: bool = False,
                 n_outputs: int | None = None, cross_check: bool = False, projector: Path | None = None,
                 template: str | None = None) -> runtime.LoadRequest:
    """What the flags ask the load path (``runtime.LoadRequest``): the options
    (``n_ctx`` None: the plan's default), --vram, --rpc, --lora, the projector,
    the template. ``n_seq`` sequences in one cache (serve's --parallel);
    ``serving``: serve's batch engine and a server's default context;
    ``n_outputs``: rows of logits per batch (speculative drafts); ``cross_check``:
    a dry run where the replay covers the model too (plan)."""
    load_config(args, n_ctx)  # says when flash attention was turned on
    return runtime.LoadRequest(
        model=path, options=load_options(args, n_ctx), vram=getattr(args, "vram", None), rpc=tuple(getattr(args, "rpc", None) or ()),
        lora=tuple(lora_specs(args)), projector=projector, template=template, parallel=n_seq, serving=serving, n_outputs=n_outputs,
        dry_run=not getattr(args, "no_dry_run", False), cross_check=cross_check)


def plan_load(args: argparse.Namespace, request: runtime.LoadRequest) -> runtime.Planned:
    """``runtime.plan``, saying what the user should know of the fit: a typed
    --ctx beyond the trained context, a refit on llama.cpp's larger compute figure."""
    planned = runtime.plan(request)
    fit, n_ctx, n_seq = planned.fit, request.options.n_ctx, max(request.parallel, 1)
    if getattr(args, "ctx_typed", False) and n_ctx and fit.trained_ctx and n_ctx // n_seq > fit.trained_ctx:
        # llama.cpp warns too (src/llama-context.cpp: "n_ctx_seq (%u) > n_ctx_train (%u) -- possible training context overflow");
        # serve's --ctx is each sequence's (the pool holds n_seq of them)
        say(f"--ctx {n_ctx // n_seq:,} is beyond the {fit.trained_ctx:,} tokens this model was trained on: replies past that point degrade")
    if planned.lp.refits:
        say(f"llama.cpp's dry run needs a larger compute buffer than estimated: refitted ({fit.sentence})")
    return planned


def fit_config(args: argparse.Namespace, path: Path, n_ctx: int | None, *, n_seq: int = 1, cross_check: bool = False,
               n_outputs: int | None = None, serving: bool = False) -> LoadPlan:
    """The options fitted to the GPU budget (detected or --vram) and RAM, as a
    load would fit them (``plan_load``): the settings that fit, the user's
    explicit choices kept, llama.cpp's dry run as the referee where the replay
    does not cover the model (unless --no-dry-run). What ``plan`` shows."""
    request = load_request(args, path, n_ctx, n_seq=n_seq, serving=serving, n_outputs=n_outputs, cross_check=cross_check)
    return plan_load(args, request).lp


def model_path(args: argparse.Namespace) -> Path:
    """The model file of ``run``, ``chat`` and ``serve``: a Hub name that is not
    downloaded is planned, asked about on a terminal, and pulled (``first_use``)."""
    return first_use.model_path(args.model, yes=getattr(args, "yes", False), no_pull=getattr(args, "no_pull", False),
                                ask=first_use.terminal_ask(), say=say, progress=not getattr(args, "json", False),
                                vram=getattr(args, "vram", None), n_ctx=getattr(args, "ctx", None),
                                request=fit_request(args, getattr(args, "ctx", None)))


def template_spec(args: argparse.Namespace) -> str | None:
    """``--template FILE|NAME`` (run, chat): the chat template to use instead of the model's."""
    spec = getattr(args, "template", None)
    if spec is not None and getattr(args, "raw", False):
        raise UsageError("--raw uses no chat template: drop --template, or drop --raw")
    return spec


def say(msg: str) -> None:

    print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)


def device_table(fitted: Fitted, path: Path, logged: dict | None = None, header: GGUFHeader | None = None) -> list[dict]:
    """Per device (workers' devices, a local GPU, the CPU): the planned weights,
    KV, compute and output bytes and the free memory; with ``logged`` (the engine's
    ``logged_buffers``) also what llama.cpp printed for each, in MiB. ``header``:
    the file's, read already for the fit."""
    pl = fitted.placement
    if pl is None:
        header = header if header is not None else read_header(path)
        shape = planner.ModelShape.from_header(header)
        hw = fitted.hardware
        devices = [placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes)] if hw.gpu_budget is not None else []
        cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
        pl = placement.place(shape, fitted.config, devices, cpu, header=header)
    rows = pl.to_list()
    for r in rows:
        r["logged_mib"] = (logged or {}).get(r["name"]) if logged is not None else None
    return rows
