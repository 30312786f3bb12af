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
    rpc = getattr(args, "rpc", None)
    app = create_app(getattr(args, "model", None), vram=getattr(args, "vram", None), settings=settings, rpc=rpc)
    app.run()
    # Textual sets 1 when the app ended on an unhandled exception (a bug): the
    # shell must not read that as success.
    rc = app.return_code or 0
    if rpc:
        from localllm import engine_rpc

        if engine_rpc.parked():  # llama.cpp holds a thread since a worker died: the interpreter would wait for it at exit
            import os
            import sys

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    return rc
