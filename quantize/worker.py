"""Child process for the quantization pipeline: ``python -m quantize.worker ARGS_JSON``.

Runs llama.cpp's quantizer and writes each llama.cpp log line to stdout as a
JSON pair ``["log", line]``, then ``["done", null]`` or ``["error", message]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    args = json.loads(sys.argv[1])
    out = sys.stdout

    def emit(kind: str, payload: str | None) -> None:
        out.write(json.dumps([kind, payload]) + "\n")
        out.flush()

    from localllm.engine import quantize_model
    from localllm.errors import LocalLLMError
    from localllm.llamalog import ROUTER

    ROUTER.listeners.append(lambda level, line: emit("log", line))
    try:
        matrix = None
        if args["imatrix"]:
            from quantize.imatrix import load_imatrix

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
