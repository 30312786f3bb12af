"""Run by the terminal tests (tests/tui/test_prompt_terminal.py) in tmux: the
cockpit on a scripted engine, in a real terminal. When it ends, it writes what
the engine was given (every conversation it rendered) as JSON to the file named
by its second argument.

    python -m tests.helpers.scripted_cockpit MODEL OUT.json [REPLY.json] [--stall] [--itl-ms=N]

REPLY.json: the reply's tokens, a JSON list of strings (default: the engine's
own " tok0 tok1 …"). ``--stall``: the load keeps the GIL for seconds (a C call
that does not release it), so the terminal's reading thread stalls and the keys
typed meanwhile arrive in one read; OUT.json.stall appears as it starts, and
OUT.json then also has its start and end (``time.time()``). ``--itl-ms=N``: the
time between two tokens (default 10; scripts/bench_tui.py's render check uses 1).
OUT.json.last gets each reply's last token's time (``time.perf_counter_ns()``)."""

from __future__ import annotations

import ctypes
import json
import sys
import time
from pathlib import Path

from localllm.engine_api import LoadConfig, LoadInfo
from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings


class StallingEngine(ScriptedEngine):
    """Its load holds the GIL in C for three seconds: no other thread of the
    process runs meanwhile."""

    stall: list[float] = []  # noqa: RUF012 - written once, by the one load
    started: Path | None = None  # written ("{}") as the stall starts

    def load(self, path: Path, config: LoadConfig, header: object = None) -> LoadInfo:
        if not self.stall:
            if self.started is not None:
                self.started.write_text("{}")
            start = time.time()
            ctypes.PyDLL(None).sleep(3)  # libc's sleep, called with the GIL held (PyDLL keeps it)
            self.stall = [start, time.time()]
        return super().load(path, config)


def main(model: str, out: str, *args: str) -> None:
    reply = next((a for a in args if not a.startswith("--")), None)
    pieces = json.loads(Path(reply).read_text()) if reply else None
    itl = next((float(a.split("=", 1)[1]) for a in args if a.startswith("--itl-ms=")), 10.0)
    engine = (StallingEngine if "--stall" in args else ScriptedEngine)(ttft_ms=50, itl_ms=itl, tokens=5, reply=pieces)
    def stamp(ns: int) -> None:
        Path(out + ".last").write_text(str(ns))

    engine.on_last_token = stamp
    if isinstance(engine, StallingEngine):
        engine.started = Path(out + ".stall")
    app = create_app(model, vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt=""),
                     backend_factory=lambda: engine, bandwidth=20e9)
    try:
        app.run()
    finally:
        Path(out).write_text(json.dumps({"chats": engine.chats, "stall": getattr(engine, "stall", None)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
