"""llama.cpp as the referee: its dry run of a load, in a child process.

``localllm.engine.dryrun`` loads with ``no_alloc`` and ``load_mode = NONE``, as
llama.cpp's own ``--fit`` does (common/fit.cpp): it reads only the header,
simulates every allocation and logs the compute and output buffers it would
allocate on each device, exact for any architecture. Run here in a child
process under a time limit, so that a llama.cpp abort (a config it cannot
build) or a hang costs the figure, never the command. Measured here: about
0.4 s for SmolLM2 (the child's start and its import of llama.cpp included; the
dry run itself takes 0.06 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from localllm.engine_api import DryRun, LoadConfig

TIMEOUT_S = 60.0


def dry_run(path: Path, config: LoadConfig, timeout: float = TIMEOUT_S) -> DryRun:
    """llama.cpp's dry run of loading ``path`` with ``config``, in a child process
    under ``timeout`` seconds: its compute and output buffers per device, or its
    reason for refusing the config (an abort included), or why no figure came."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "localllm.engine.dryrun", str(path), json.dumps(config.to_dict())],
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return DryRun(failed=f"llama.cpp's dry run took over {timeout:.0f} s", seconds=time.perf_counter() - t0)
    lines = out.stdout.strip().splitlines()
    if out.returncode < 0:  # killed by a signal: llama.cpp aborted (GGML_ASSERT) building this config
        asserts = [line[line.find("GGML_ASSERT"):] for line in out.stderr.splitlines() if "GGML_ASSERT" in line]
        why = asserts[0].strip()[:200] if asserts else f"signal {-out.returncode}"
        return DryRun(refused=f"llama.cpp aborted building this config ({why})", seconds=time.perf_counter() - t0)
    if out.returncode != 0 or not lines:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return DryRun(failed=f"llama.cpp's dry run ended with exit code {out.returncode} ({why})", seconds=time.perf_counter() - t0)
    try:
        d = json.loads(lines[-1])
        return DryRun(buffers={str(k): {str(kk): int(vv) for kk, vv in v.items()} for k, v in d["buffers"].items()},
                      seconds=d["seconds"], refused=d["refused"], failed=d["failed"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return DryRun(failed=f"llama.cpp's dry run printed no readable result ({type(exc).__name__})", seconds=time.perf_counter() - t0)
