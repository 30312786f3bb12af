"""llama.cpp's dry run, in this process: a load that reads the header and
simulates every allocation (the child that ``plan.referee`` starts runs this).

With ``llama_model_params.no_alloc`` and ``load_mode = LLAMA_LOAD_MODE_NONE``
llama.cpp builds the model and the context without reading a weight or
allocating a buffer, and logs the buffers it would allocate: this is what its
own ``--fit`` does (common/fit.cpp). The compute and output buffers it logs are
exact for any architecture and device; the model and KV buffers print 0.00 MiB
in this mode, so those stay with the rules (``plan.planner``).

``plan.referee.dry_run`` runs it in a child process (``python -m
localllm.engine.dryrun``) under a time limit: a llama.cpp abort or hang costs
the figure, never the command. Measured here: 0.06 s in process for SmolLM2 at
4096 tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp

from localllm.engine.llamalog import ROUTER
from localllm.engine.model import check_config, llama_params, load_model_and_context
from localllm.engine.native import install_log_router
from localllm.engine_api import DryRun, LoadConfig
from localllm.errors import LocalLLMError
from localllm.plan.placement import logged_buffers

MiB = 1024 * 1024


def run(path: Path, config: LoadConfig) -> DryRun:
    """The dry run in this process (llama.cpp may abort it: see ``run_isolated``).
    Only the bounds llama.cpp would wrap are checked first (``check_config``):
    the cache-type rules are left to llama.cpp, the referee here."""
    try:
        check_config(config)
    except LocalLLMError as exc:
        return DryRun(refused=str(exc))
    install_log_router()
    mparams, cparams, keep = llama_params(config)  # noqa: F841  (keep: arrays that must outlive the load)
    cparams.n_outputs_max = config.n_outputs_max
    mparams.no_alloc = True
    mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    mark = ROUTER.mark()
    t0 = time.perf_counter()
    try:
        model, ctx, _ = load_model_and_context(path, config, mparams, cparams)
    except LocalLLMError as exc:
        return DryRun(refused=str(exc), seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    logged = logged_buffers([line for _, line in ROUTER.lines_since(mark)])
    buffers = {dev: {kind: round(sum(mibs) * MiB) for kind, mibs in kinds.items() if kind in ("compute", "output")}
               for dev, kinds in logged.items()}
    return DryRun({dev: b for dev, b in buffers.items() if b}, seconds)


def _config(d: dict[str, Any]) -> LoadConfig:
    for key in ("rpc_servers", "tensor_split"):
        d[key] = tuple(d.get(key) or ())
    return LoadConfig(**d)


def serve(idle: float) -> int:
    """Answer requests, one JSON line each on stdin (``{"path", "config"}``), with
    one line each on stdout (``DryRun.MARK`` and the result) until stdin ends, or until
    ``idle`` seconds pass without one (``idle`` <= 0: no limit)."""
    import selectors

    pending = b""
    with selectors.DefaultSelector() as sel:
        sel.register(sys.stdin.buffer, selectors.EVENT_READ)
        while True:
            if b"\n" not in pending:
                if not sel.select(idle if idle > 0 else None):
                    return 0  # idle: the parent starts another when it needs one
                chunk = os.read(sys.stdin.buffer.fileno(), 65536)
                if not chunk:
                    return 0
                pending += chunk
                continue
            line, _, pending = pending.partition(b"\n")
            try:
                d = json.loads(line)
                result = run(Path(d["path"]), _config(d["config"]))
            except Exception as exc:  # noqa: BLE001  (a bad request, a worker refused: this request's answer, not the child's end)
                result = DryRun(failed=f"the dry run raised {type(exc).__name__}: {exc}"[:300])
            sys.stdout.write(DryRun.MARK + json.dumps(result.to_dict()) + "\n")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    """``python -m localllm.engine.dryrun serve IDLE_S``: ``plan.referee``'s child."""
    if len(argv) != 2 or argv[0] != "serve":
        print("usage: python -m localllm.engine.dryrun serve IDLE_S (plan.referee starts it)", file=sys.stderr)
        return 2
    return serve(float(argv[1]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
