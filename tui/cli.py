"""``localllm`` (no arguments) and ``localllm tui [MODEL]`` open the cockpit."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localllm import flags
from localllm.compaction import COCKPIT_AT, KEEP_TURNS

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.tui.app import LocalLLMApp
    from localllm.tui.settings import Settings

# what a --ctx left out asks for
TUI_CTX = "the plan's: the model's trained context, at most 4096; or the cockpit's setting"


def register(sub: Subparsers) -> None:
    p = sub.add_parser("tui", help="the cockpit: chat with live TTFT, ITL, memory budget and KV cache (also: bare localllm)")
    flags.add_conversation(p, system_help="system prompt (default: a helpful assistant)")
    flags.add_load_options(p, ctx_help=f"context size in tokens (default: {TUI_CTX})")
    flags.add_lora(p)
    flags.add_vision(p, image=False)  # a vision model: pictures attached on screen (Ctrl+F, or a path pasted)
    p.add_argument("--tools", default=None, metavar="NAME[,NAME]|all",
                   help="offer the model these MCP servers' tools (the config file's [mcp.servers]); each call is approved on screen")
    p.add_argument("--compact-at", type=flags.compact_at, default=COCKPIT_AT, metavar="FRACTION|off",
                   help="summarize the older turns with the model when the context is this full, keeping the system prompt and "
                        f"the last {KEEP_TURNS} turns; off: the sliding window alone (default: {COCKPIT_AT}; F3 changes it)")


@dataclass(frozen=True)
class Options:
    model: str | None
    pull: flags.Pull
    system: str | None
    sampling: flags.Sampling
    load: flags.Load
    lora: flags.Lora
    vision: flags.Vision
    tools: str | None
    compact_at: float | None = COCKPIT_AT
    reasoning: str = "auto"
    speculate: str = "auto"

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, pull=flags.Pull.from_args(ns), system=ns.system, sampling=flags.Sampling.from_args(ns),
                   load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns), vision=flags.Vision.from_args(ns), tools=ns.tools,
                   compact_at=ns.compact_at,
                   reasoning=ns.reasoning, speculate=ns.speculate)


def settings_from_args(args: argparse.Namespace | Options) -> Settings:
    """The cockpit's settings from every load option ``localllm tui`` accepts;
    the fitting service reads them (``Settings.fit_request``) as it reads the
    CLI's options."""
    # lazy: the cockpit's settings read LoRA headers through gguf (~0.1 s), which --help (register above) does not need
    from localllm.modelfile.lora import specs_from_flags
    from localllm.tui.settings import Settings  # lazy: as above

    opts = args if isinstance(args, Options) else Options.from_args(args)
    load, sampling = opts.load, opts.sampling
    return Settings(
        n_ctx=load.ctx,  # None: the plan decides (fitting.default_ctx), as run and chat
        type_k=load.k_type or load.kv_type or "f16",
        type_v=load.v_type or load.kv_type or "f16",
        n_gpu_layers=load.ngl,
        threads=load.threads,
        swa_full=load.swa_full,
        flash_attn=load.flash_attn,
        n_batch=load.batch,
        n_ubatch=load.ubatch,
        policy=load.policy,
        n_cpu_moe=load.n_cpu_moe,
        temperature=sampling.temp,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        repeat_penalty=sampling.repeat_penalty,
        max_tokens=sampling.n_predict,
        seed=sampling.seed,
        reasoning_budget=sampling.reasoning_budget,
        thinking=opts.reasoning != "off",
        speculate=opts.speculate,
        compact_at=opts.compact_at,
        system_prompt=Settings.system_prompt if opts.system is None else opts.system,
        lora=tuple((str(s.path), s.scale) for s in specs_from_flags(list(opts.lora.adapters) or None, opts.lora.init_without_apply)),
    )


def app_from_args(args: argparse.Namespace | Options, **kw: Any) -> LocalLLMApp:
    """The cockpit ``localllm tui`` opens (``kw``: ``create_app``'s test hooks)."""
    # lazy: loads Textual (~254 ms here), which cli does not load at import
    from localllm.tui.app import create_app

    opts = args if isinstance(args, Options) else Options.from_args(args)
    return create_app(opts.model, vram=opts.load.vram, settings=settings_from_args(opts), rpc=list(opts.load.rpc) or None,
                      mmproj=opts.vision.mmproj, no_mmproj=opts.vision.no_mmproj, **kw)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from localllm.modelfile.lora import read_adapter  # lazy: as in settings_from_args
    from localllm.store import first_use  # lazy: the store loads gguf (~0.1 s), which --help does not need

    opts = Options.from_args(args)
    for spec in settings_from_args(opts).adapter_specs():
        read_adapter(spec.path)  # --lora: a missing, foreign or damaged file is one line before the cockpit opens
    if opts.model is not None:
        # a Hub name not downloaded is planned, asked about and pulled before the cockpit opens
        opts = replace(opts, model=str(first_use.model_path(opts.model, yes=opts.pull.yes, no_pull=opts.pull.no_pull,
                                                            ask=first_use.terminal_ask(), say=lambda m: print(f"localllm: {m}", file=sys.stderr),
                                                            vram=opts.load.vram, n_ctx=opts.load.ctx,
                                                            request=settings_from_args(opts).fit_request())))
    hub, tools_config = None, None
    if opts.tools:  # the MCP servers start before the screen opens: one that fails is a line here
        # lazy: localllm.mcp's hub and the tool-call formats, only with --tools
        from localllm.tui.tools import start_hub

        hub, tools_config = start_hub(opts.tools, lambda m: print(f"localllm: {m}", file=sys.stderr))
    try:
        app = app_from_args(opts, **({"hub": hub, "tools_config": tools_config} if hub is not None else {}))
        app.run()
    finally:
        if hub is not None:
            hub.close()
    # Textual sets 1 when the app ended on an unhandled exception (a bug): the
    # shell must not read that as success.
    rc = app.return_code or 0
    if opts.load.rpc:
        # lazy: loads llama.cpp (~169 ms here), which cli does not load at import
        from localllm.engine.rpc import parked

        if parked():  # llama.cpp holds a thread since a worker died: the interpreter would wait for it at exit
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    return rc
