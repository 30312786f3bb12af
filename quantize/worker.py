"""Child process for the quantization pipeline: ``python -m localllm.quantize.worker ARGS_JSON``.

Runs llama.cpp's quantizer and writes each llama.cpp log line to stdout as a
JSON pair ``["log", line]``, then ``["done", null]`` or ``["error", message]``.

It dies with its parent: the parent may be killed (SIGKILL, SIGTERM, a closed
terminal) and nothing else would stop a quantizer writing gigabytes. On Linux
the kernel sends SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG);
elsewhere a watchdog thread polls the parent's pid.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from localllm.errors import LocalLLMError

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Exit as soon as ``parent`` is gone (also if it already is)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main() -> int:
    args = json.loads(sys.argv[1])
    if args.get("parent"):
        die_with_parent(int(args["parent"]))
    out = sys.stdout

    def emit(kind: str, payload: str | None) -> None:
        out.write(json.dumps([kind, payload]) + "\n")
        out.flush()

    # lazy: loads gguf, llama.cpp, numpy (~155 ms here), which worker does not load at import
    from localllm.engine import quantize_model

    # lazy: loads gguf, llama.cpp, numpy (~174 ms here), which worker does not load at import
    from localllm.engine.llamalog import ROUTER

    ROUTER.listeners.append(lambda level, line: emit("log", line))
    try:
        matrix = None
        if args["imatrix"]:
            # lazy: loads gguf, numpy (~70 ms here), which worker does not load at import
            from localllm.quantize.imatrix import load_imatrix

            matrix = load_imatrix(Path(args["imatrix"]))
        quantize_model(
            Path(args["src"]), Path(args["dst"]), args["type"], n_threads=args["threads"],
            allow_requantize=args["allow_requantize"], dry_run=args["dry_run"], imatrix=matrix,
        )
    except LocalLLMError as exc:
        emit("error", str(exc))
        return 1
    except Exception as exc:  # any failure becomes one line in the parent
        emit("error", f"{type(exc).__name__}: {exc}")
        return 1
    emit("done", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
