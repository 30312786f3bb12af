"""What the model-loading commands share (run, chat, bench, doctor, plan, serve):
their typed load options -> a ``runtime.LoadRequest``, and the load path
(``localllm.runtime``: the fitting service, then the load) asked with it.

Light at import, as every module ``localllm --help`` reaches through a command's
``register``: the runtime, the planner and the store (which load gguf, ~0.1 s
measured here) are imported by the functions that use them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.flags import Load, Lora, Pull
from localllm.util.fmt import safe

if TYPE_CHECKING:
    from localllm import runtime
    from localllm.engine_api import LoadConfig
    from localllm.modelfile.lora import AdapterSpec
    from localllm.plan import fitting
    from localllm.plan.prepare import LoadPlan

    Fitted = LoadPlan  # what the loading commands get: the fit, the hardware, the refereed figures


def say(msg: str) -> None:
    print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)


def load_options(load: Load, n_ctx: int | None) -> fitting.LoadOptions:
    """The load options the flags give (``fitting.LoadOptions``, the shape the
    cockpit's settings take too): ``--kv-type`` sets both cache types,
    ``--k-type``/``--v-type`` one each; ``n_ctx`` None: the plan decides."""
    from localllm.plan import fitting  # lazy: the planner loads gguf (~0.1 s), which --help does not need

    return fitting.LoadOptions(
        n_ctx=n_ctx, threads=load.threads, n_gpu_layers=load.ngl, type_k=load.k_type or load.kv_type,
        type_v=load.v_type or load.kv_type, flash_attn=load.flash_attn, swa_full=load.swa_full, n_batch=load.batch,
        n_ubatch=load.ubatch, policy=load.policy, rpc_servers=tuple(str(ep) for ep in load.rpc), n_cpu_moe=load.n_cpu_moe,
    )


def load_config(load: Load, n_ctx: int | None) -> LoadConfig:
    """The load settings the options ask for, saying so when a quantized V
    cache turns flash attention on against --flash-attn off."""
    cfg = load_options(load, n_ctx).config()
    if cfg.flash_attn != load.flash_attn and load.flash_attn == "off":
        say(f"a quantized V cache ({cfg.type_v}) needs flash attention: turning it on")
    return cfg


def lora_specs(lora: Lora) -> list[AdapterSpec]:
    """``--lora``/``--lora-scaled`` in the order given (an adapter's id is its
    place), each at scale 0 with ``--lora-init-without-apply``. A flag without
    an adapter is a usage error."""
    from localllm.modelfile.lora import specs_from_flags  # lazy: loads gguf (~30 ms), which --help does not need

    return specs_from_flags(list(lora.adapters) or None, lora.init_without_apply)


def fit_request(load: Load, lora: Lora, n_ctx: int | None) -> fitting.Request:
    """What the options fix: the config, the cache types and GPU layers the user
    named (kept), the policy, and the LoRA adapters to count (``--lora``)."""
    from dataclasses import replace

    from localllm.modelfile.lora import read_adapter  # lazy: as lora_specs

    load_config(load, n_ctx)  # says when flash attention was turned on
    return replace(load_options(load, n_ctx).request(), adapters=tuple(read_adapter(s.path) for s in lora_specs(lora)))


def load_request(load: Load, lora: Lora, path: Path, n_ctx: int | None, *, n_seq: int = 1, serving: bool = False,
                 n_outputs: int | None = None, cross_check: bool = False, projector: Path | None = None,
                 template: str | None = None) -> runtime.LoadRequest:
    """What the flags ask the load path (``runtime.LoadRequest``): the options
    (``n_ctx`` None: the plan's default), --vram, --rpc, --lora, the projector,
    the template. ``n_seq`` sequences in one cache (serve's --parallel);
    ``serving``: serve's batch engine and a server's default context;
    ``n_outputs``: rows of logits per batch (speculative drafts); ``cross_check``:
    a dry run where the replay covers the model too (plan)."""
    from localllm import runtime  # lazy: the load path loads the planner and gguf (~0.1 s), which --help does not need

    load_config(load, n_ctx)  # says when flash attention was turned on
    return runtime.LoadRequest(
        model=path, options=load_options(load, n_ctx), vram=load.vram, rpc=load.rpc,
        lora=tuple(lora_specs(lora)), projector=projector, template=template, parallel=n_seq, serving=serving, n_outputs=n_outputs,
        dry_run=not load.no_dry_run, cross_check=cross_check)


def plan_load(load: Load, request: runtime.LoadRequest) -> runtime.Planned:
    """``runtime.plan``, saying what the user should know of the fit: a typed
    --ctx beyond the trained context, a refit on llama.cpp's larger compute figure."""
    from localllm import runtime  # lazy: as load_request

    planned = runtime.plan(request)
    fit, n_ctx, n_seq = planned.fit, request.options.n_ctx, max(request.parallel, 1)
    if load.ctx_typed and n_ctx and fit.trained_ctx and n_ctx // n_seq > fit.trained_ctx:
        # llama.cpp warns too (src/llama-context.cpp: "n_ctx_seq (%u) > n_ctx_train (%u) -- possible training context overflow");
        # serve's --ctx is each sequence's (the pool holds n_seq of them)
        say(f"--ctx {n_ctx // n_seq:,} is beyond the {fit.trained_ctx:,} tokens this model was trained on: replies past that point degrade")
    if planned.lp.refits:
        say(f"llama.cpp's dry run needs a larger compute buffer than estimated: refitted ({fit.sentence})")
    return planned


def model_path(model: str | None, pull: Pull, load: Load, lora: Lora, *, progress: bool = True) -> Path:
    """The model file of ``run``, ``chat`` and ``serve``: a Hub name that is not
    downloaded is planned, asked about on a terminal, and pulled (``first_use``)."""
    from localllm.store import first_use  # lazy: the store's resolver loads gguf (~0.1 s), which --help does not need

    return first_use.model_path(model, yes=pull.yes, no_pull=pull.no_pull, ask=first_use.terminal_ask(), say=say, progress=progress,
                                vram=load.vram, n_ctx=load.ctx, request=fit_request(load, lora, load.ctx))
