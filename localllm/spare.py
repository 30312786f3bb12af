"""A spare child: a process that has already imported what ``serve`` needs,
waiting to be told which model to serve.

A model switch in router mode is: stop model A's child, start B's, wait for
its first token. Starting ``python -m localllm serve`` spends most of its time
importing (Python, Starlette, uvicorn, llama-cpp-python and libllama: about
0.6 s of the 1.1 s a child took to be ready here, where llama-server's child
is ready in 0.3 s). The pool keeps one such process started ahead of need
(``pool.Spares``) and hands it a ``serve`` command line when a model must
load, so a switch pays for the model's load, not for the imports; a new spare
is then started in the background.

The protocol is one JSON line on stdin, ``{"argv": [...]}``: ``localllm``'s
arguments as a child's command line would have them (``-v serve PATH --alias
NAME ...``). stdin closing without one (the router stopping) ends the spare.
Its environment (the internal key, the config path) is the child's, given at
its start by the pool. A line that is not that shape is one error line and
exit 2: the router wrote it, but nothing read from a pipe is trusted.
"""

from __future__ import annotations

import json
import sys

MAX_LINE = 64 * 1024


def main() -> int:
    # What a serve child imports before it can load a model, before it is told which (that is this process's whole point):
    import localllm.cli  # lazy: the CLI, which runs the command it is handed
    import localllm.commands.serve  # lazy: serve's command (uvicorn's config, the fit)
    import localllm.engine.batch  # lazy: llama-cpp-python and libllama (~0.3 s of the 0.6 s)
    import localllm.serve.app  # lazy: Starlette and the routes
    import localllm.serve.lifecycle  # noqa: F401 - lazy: uvicorn and uvloop; imported ahead, used by serve once told
    import localllm.serve.server  # lazy: the server over a loaded model, and what it reads of one (serve.wiring)

    try:
        line = sys.stdin.readline(MAX_LINE)
    except KeyboardInterrupt:  # Ctrl+C in the router's terminal reaches its whole process group: a spare just ends
        return 130
    if not line:
        return 0
    try:
        argv = json.loads(line)["argv"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a list of strings")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"localllm: error: a spare child was handed a bad command ({exc})", file=sys.stderr, flush=True)
        return 2
    sys.argv = ["localllm", *argv]  # as ``python -m localllm ARGV`` sets it (serve's exec_fresh reads it)
    return localllm.cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
