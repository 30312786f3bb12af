"""``localllm`` (no arguments) and ``localllm tui [MODEL]`` open the cockpit."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from localllm.modelfile.lora import read_adapter, specs_from_flags
from localllm.store import first_use
from localllm.tui.settings import Settings

if TYPE_CHECKING:
    from localllm.tui.app import LocalLLMApp


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The cockpit's settings from every load option ``localllm tui`` accepts;
    the fitting service reads them (``Settings.fit_request``) as it reads the
    CLI's options."""
    return Settings(
        n_ctx=getattr(args, "ctx", None) or 4096,
        type_k=getattr(args, "k_type", None) or getattr(args, "kv_type", None) or "f16",
        type_v=getattr(args, "v_type", None) or getattr(args, "kv_type", None) or "f16",
        n_gpu_layers=getattr(args, "ngl", None),
        threads=getattr(args, "threads", None),
        swa_full=bool(getattr(args, "swa_full", False)),
        flash_attn=getattr(args, "flash_attn", "auto"),
        n_batch=getattr(args, "batch", 512),
        n_ubatch=getattr(args, "ubatch", 512),
        policy=getattr(args, "policy", "ctx"),
        n_cpu_moe=getattr(args, "n_cpu_moe", None),
        temperature=getattr(args, "temp", Settings.temperature),
        top_k=getattr(args, "top_k", Settings.top_k),
        top_p=getattr(args, "top_p", Settings.top_p),
        min_p=getattr(args, "min_p", Settings.min_p),
        repeat_penalty=getattr(args, "repeat_penalty", Settings.repeat_penalty),
        max_tokens=getattr(args, "n_predict", Settings.max_tokens),
        seed=getattr(args, "seed", Settings.seed),
        system_prompt=Settings.system_prompt if getattr(args, "system", None) is None else args.system,
        lora=tuple((str(s.path), s.scale) for s in specs_from_flags(getattr(args, "lora", None), bool(getattr(args, "lora_init_without_apply", False)))),
    )


def app_from_args(args: argparse.Namespace, **kw: Any) -> LocalLLMApp:
    """The cockpit ``localllm tui`` opens (``kw``: ``create_app``'s test hooks)."""
    # lazy: loads Textual (~254 ms here), which cli does not load at import
    from localllm.tui.app import create_app

    return create_app(getattr(args, "model", None), vram=getattr(args, "vram", None), settings=settings_from_args(args),
                      rpc=getattr(args, "rpc", None), mmproj=getattr(args, "mmproj", None), no_mmproj=bool(getattr(args, "no_mmproj", False)),
                      **kw)


def run(args: argparse.Namespace) -> int:
    rpc = getattr(args, "rpc", None)
    for spec in settings_from_args(args).adapter_specs():
        read_adapter(spec.path)  # --lora: a missing, foreign or damaged file is one line before the cockpit opens
    if getattr(args, "model", None) is not None:
        # a Hub name not downloaded is planned, asked about and pulled before the cockpit opens
        args.model = str(first_use.model_path(args.model, yes=getattr(args, "yes", False), no_pull=getattr(args, "no_pull", False),
                                              ask=first_use.terminal_ask(), say=lambda m: print(f"localllm: {m}", file=sys.stderr),
                                              vram=getattr(args, "vram", None), n_ctx=getattr(args, "ctx", None),
                                              request=settings_from_args(args).fit_request()))
    hub, tools_config = None, None
    if getattr(args, "tools", None):  # the MCP servers start before the screen opens: one that fails is a line here
        # lazy: localllm.mcp's hub and the tool-call formats, only with --tools
        from localllm.tui.tools import start_hub

        hub, tools_config = start_hub(args.tools, lambda m: print(f"localllm: {m}", file=sys.stderr))
    try:
        app = app_from_args(args, **({"hub": hub, "tools_config": tools_config} if hub is not None else {}))
        app.run()
    finally:
        if hub is not None:
            hub.close()
    # Textual sets 1 when the app ended on an unhandled exception (a bug): the
    # shell must not read that as success.
    rc = app.return_code or 0
    if rpc:
        # lazy: loads llama.cpp (~169 ms here), which cli does not load at import
        from localllm.engine.rpc import parked

        if parked():  # llama.cpp holds a thread since a worker died: the interpreter would wait for it at exit
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    return rc
