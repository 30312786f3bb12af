"""``localllm`` (no arguments) and ``localllm tui [MODEL]`` open the cockpit."""

from __future__ import annotations

import argparse

from localllm.tui.settings import Settings


def run(args: argparse.Namespace) -> int:
    from localllm.tui.app import create_app

    settings = Settings(
        n_ctx=getattr(args, "ctx", None) or 4096,
        type_k=getattr(args, "k_type", None) or getattr(args, "kv_type", None) or "f16",
        type_v=getattr(args, "v_type", None) or getattr(args, "kv_type", None) or "f16",
        n_gpu_layers=getattr(args, "ngl", None),
        threads=getattr(args, "threads", None),
        swa_full=bool(getattr(args, "swa_full", False)),
        temperature=getattr(args, "temp", 0.7),
        max_tokens=getattr(args, "n_predict", 512),
        system_prompt=Settings.system_prompt if getattr(args, "system", None) is None else args.system,
    )
    app = create_app(getattr(args, "model", None), vram=getattr(args, "vram", None), settings=settings)
    app.run()
    # Textual sets 1 when the app ended on an unhandled exception (a bug): the
    # shell must not read that as success.
    return app.return_code or 0
