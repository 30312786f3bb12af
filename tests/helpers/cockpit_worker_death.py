"""Run by tests/tui/test_rpc.py in its own process: the cockpit under Pilot over
one worker, which the script kills mid-reply. Prints one JSON object with what
the screen showed. Its own process because llama.cpp then holds a thread for
good (rpc.keep_alive_on_abort): the interpreter could not exit normally,
so this script leaves as ``localllm tui`` does, with os._exit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import traceback


async def main(port: int, worker_pid: int) -> dict:
    from localllm.cli import _setup_logging
    from localllm.plan.workers import Endpoint
    from localllm.tui.app import create_app
    from localllm.tui.chatview import ChatView
    from localllm.tui.settings import Settings

    _setup_logging(False)  # as `localllm tui` does: llama.cpp's log must not reach the terminal
    out: dict = {}
    app = create_app("smollm2", settings=Settings(n_ctx=2048, threads=1, temperature=0.0, max_tokens=1500, system_prompt=""),
                     rpc=[Endpoint("127.0.0.1", port)], bandwidth=20e9)

    def notes() -> list[str]:
        return [m.text for m in app.query_one(ChatView).messages if m.role == "note"]

    async def until(cond, timeout: float) -> bool:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > timeout:
                return False
            await asyncio.sleep(0.02)
        return True

    async def must(cond, what: str, timeout: float = 30.0) -> None:
        """Let Textual handle what is pending, then wait for ``cond``; past the
        deadline, a TimeoutError naming what never happened (on stderr: the test shows it)."""
        await pilot.pause()
        if not await until(cond, timeout):
            raise TimeoutError(f"waited {timeout:g} s: the cockpit never {what} (notes: {notes()})")

    async with app.run_test(size=(140, 45)) as pilot:
        out["loaded"] = await until(lambda: not app.busy and app.chat is not None, 120)
        app.query_one("#prompt").value = "Write a very long story about a lighthouse keeper, with many chapters."
        await pilot.press("enter")
        reply = app.query_one(ChatView).messages[-1]
        out["started"] = await until(lambda: len(reply.text) >= 20, 60)
        out["text_at_kill"] = reply.text
        os.kill(worker_pid, signal.SIGKILL)
        t0 = time.monotonic()
        out["ended"] = await until(lambda: not app.busy, 60)
        out["end_s"] = time.monotonic() - t0
        await must(lambda: any(n.startswith("error:") for n in notes()), "said the model was lost")
        out["reply"] = reply.text
        out["notes"] = notes()
        # still responsive: Enter is handled, and a screen opens and closes
        app.query_one("#prompt").value = "are you there?"
        await pilot.press("enter")
        await must(lambda: len(notes()) > len(out["notes"]), "answered Enter with no model loaded")
        app.reload_model()  # over the same worker: refused at once (llama.cpp holds the lost connection), never a hang
        out["reload"] = await until(lambda: not app.busy, 30)
        out["after"] = notes()[len(out["notes"]):]
        await pilot.press("f3")
        await must(lambda: type(app.screen).__name__ == "SettingsScreen", "opened the settings screen")
        out["settings_screen"] = type(app.screen).__name__
        await pilot.press("escape")
        await must(lambda: type(app.screen).__name__ != "SettingsScreen", "closed the settings screen on Esc")
        out["back"] = type(app.screen).__name__
        t0 = time.monotonic()
        await pilot.press("ctrl+q")
    out["quit_s"] = time.monotonic() - t0
    from localllm.engine import rpc

    out["parked"] = rpc.parked()
    out["saved"] = app.saved.messages if app.saved is not None else None
    return out


if __name__ == "__main__":
    try:
        result = asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
    except BaseException:  # noqa: BLE001 - said on stderr; the process cannot exit normally (see above)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)
