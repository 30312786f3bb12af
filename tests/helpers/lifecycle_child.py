"""``localllm.serve.lifecycle.serve`` in a process of its own, with a stand-in app
and a load that waits for a file: the server's life without a model.

    python -m tests.helpers.lifecycle_child GATE GRACE_S

prints ``port N`` once listening; ``load`` returns when GATE exists (``fail`` in
it makes the load raise); ``/stream`` sends an event every 50 ms until the server
aborts it; the exit line is ``stopped: R requests, A aborted``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from localllm.serve import lifecycle


def main() -> int:
    gate, lifecycle.GRACE_S = Path(sys.argv[1]), float(sys.argv[2])
    stopping: list[str] = []

    async def stream(request):
        async def events():
            while not stopping:
                yield "data: tick\n\n"
                await asyncio.sleep(0.05)
            yield f"data: error: {stopping[0]}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request):
        return JSONResponse({"status": "ok"})

    switch = lifecycle.Switch()

    def load() -> None:
        while not gate.exists():
            time.sleep(0.02)
        if "fail" in gate.read_text():
            raise RuntimeError("the load failed")
        if switch.stopped:
            print("stopped while loading", flush=True)
            return
        switch.app = Starlette(routes=[Route("/health", health), Route("/stream", stream)])

    def abort(reason: str) -> int:
        stopping.append(reason)
        return 1

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"port {sock.getsockname()[1]}", flush=True)
    try:
        server = lifecycle.serve(switch, [sock], load, abort)
    except RuntimeError as exc:
        print(f"load error: {exc}", flush=True)
        return 1
    print(f"stopped: {switch.requests} requests, {server.aborted} aborted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
