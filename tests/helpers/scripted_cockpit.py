"""Run by the terminal tests (tests/tui/test_prompt_terminal.py) in tmux: the
cockpit on a scripted engine, in a real terminal. When it ends, it writes what
the engine was given (every conversation it rendered) as JSON to the file named
by its second argument.

    python -m tests.helpers.scripted_cockpit MODEL OUT.json [REPLY.json]

REPLY.json: the reply's tokens, a JSON list of strings (default: the engine's
own " tok0 tok1 …")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings


def main(model: str, out: str, reply: str | None = None) -> None:
    pieces = json.loads(Path(reply).read_text()) if reply else None
    engine = ScriptedEngine(ttft_ms=50, itl_ms=10, tokens=5, reply=pieces)
    app = create_app(model, vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt=""),
                     backend_factory=lambda: engine, bandwidth=20e9)
    try:
        app.run()
    finally:
        Path(out).write_text(json.dumps(engine.chats))


if __name__ == "__main__":
    main(*sys.argv[1:4])
