"""Does the cockpit slow the stream? The time a reply takes to stream on the
screen, from its first token to its last, on the wall clock, in the cockpit
against ``localllm chat`` (the same chat loop with no screen to draw) for the
same prompt, model and settings (greedy: the same tokens), both in a real
terminal (tmux, same size), alternating reply by reply. Target: the cockpit
streams at >= 0.95x chat's speed (chat's stream time over the cockpit's).

Why the wall clock: the decode rate the engine reports is the time inside
``llama_decode``; a stall between two decodes (the UI thread holding the GIL
while the engine thread waits to sample the next token) is invisible to it,
and that stall is what this benchmark exists to catch. So the screen is read
every ``--poll-ms`` (tmux capture-pane, the same for both programs): a reply's
first token is on screen when chat has printed text after the prompt, or when
the cockpit shows its TTFT (drawn in the same frame as the first text); its
last when chat prints its summary line or the cockpit its final figures (the
prefill rate), each drawn right after the last token. The poll's period bounds
the error of each reading (+-50 ms on a 4-second reply by default).

Both run in the terminal because drawing text costs CPU in the terminal too
(tmux's own process): comparing against output into a pipe would charge that
cost to the cockpit alone.

On this 2-core machine one reply's decode rate varies by up to 15% from the
next, in the same process too, so the comparison needs many replies. Both
programs stay open (no start-up or model load between replies), each reply
starts from an empty chat (Ctrl+L in the cockpit, /clear in chat), one warm-up
reply each is not counted, and the program not answering is stopped (SIGSTOP)
so that its timers take nothing from the other. The verdict uses the median of
the per-pair ratios (a reply of each, back to back).

The steadier figure is the cockpit's own cost: the CPU time of its UI thread
(Textual's event loop: it computes and draws every frame) from Enter to the
reply's final figures, read from /proc on Linux. llama.cpp's decode threads
use every core, so that time comes out of decoding.

    python scripts/bench_tui.py [--model smollm2] [--tokens 256] [--reps 12] [--poll-ms 50]
    python scripts/bench_tui.py --quick    # one pair of 32-token replies: checks it completes (no verdict on the ratio)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.tmuxdrive import Tmux  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def _env() -> dict[str, str]:
    """Where the children find localllm and its data: the tmux server may have
    been started with another environment than this process."""
    keep = ("LOCALLLM_TUI_BATCH_MS", "LOCALLLM_TUI_PANEL_MS", "LOCALLLM_HOME", "HF_HOME", "HF_ENDPOINT", "OLLAMA_MODELS", "LOCALLLM_LMSTUDIO_DIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return env


def _cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) of the thread whose id is ``pid``: a process's
    main thread, Textual's event loop in the cockpit. None off Linux."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Side:
    """One program in its own tmux session, answering the same prompt on demand."""

    poll = 0.05  # seconds between two readings of the screen (--poll-ms)

    def __init__(self, name: str, cmd: list[str], ready: str) -> None:
        self.name = name
        self.term = Tmux(cmd, env=_env())
        try:
            self.term.wait_for(ready, timeout=180)
        except BaseException:
            self.term.close()
            raise
        self.pid = self.term.pane_pid()  # env(1) execs python: the pane's process is the program

    def pause(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        self.term.close()

    def stream(self, first: Callable[[str], object], last: Callable[[str], object], history: bool = False,
               timeout: float = 300) -> tuple[float, str]:
        """Read the screen every ``poll`` seconds from now (just after Enter):
        the wall-clock seconds from the first reading where ``first`` holds (the
        first token is on screen) to the first where ``last`` does (the last
        one is), and that last screen."""
        t_first = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.monotonic()
            screen = self.term.screen(history=history)
            if t_first is None and first(screen):
                t_first = now
            if t_first is not None and last(screen):
                return now - t_first, screen
            time.sleep(max(self.poll - (time.monotonic() - now), 0))
        raise TimeoutError(f"{self.name}: the reply did not finish on screen:\n{self.term.screen()}")


class Cockpit(Side):
    def __init__(self, model: list[str], tokens: int) -> None:
        super().__init__("tui", [sys.executable, "-m", "localllm", "tui", *model, "--temp", "0", "-n", str(tokens), "--system", "",
                                 "--vram", "4GiB"], r"context \d+ · KV")

    def reply(self) -> tuple[float, float, int, float | None]:
        """Seconds from the first token on screen to the last (wall clock),
        decode t/s the cockpit shows, tokens in context, and the share of one
        core its UI thread used from Enter to the reply's final figures."""
        t = self.term
        t.send("C-l")  # a new chat: the reply starts from the same empty context each time
        # cleared (the chat and the last reply's figures): the prompt below can
        # only be the one in the input box, and a verdict can only be the new reply's
        t.wait_for_absent(r"you ›|prefill [\d.]+ t/s", timeout=30)
        t.send(PROMPT, literal=True)
        t.wait_for(re.escape(PROMPT[-20:]), timeout=30)  # typed whole: the keys are not counted as the reply's cost
        cpu0, wall0 = _cpu_seconds(self.pid), time.monotonic()
        t.send("Enter")
        # TTFT is drawn with the first text; the prefill rate with the reply's
        # final figures, right after its last text (read from the same screen:
        # other lines, e.g. the roofline, may stand between them).
        seconds, screen = self.stream(lambda sc: re.search(r"TTFT [\d.]+ ms", sc), lambda sc: re.search(r"prefill [\d.]+ t/s", sc))
        cpu1, wall1 = _cpu_seconds(self.pid), time.monotonic()
        time.sleep(0.3)  # a reading can catch a frame half written (its upper rows new): read the figures from a whole one
        screen = t.screen()
        decode = re.search(r"decode ([\d.]+) t/s", screen)
        used = re.search(r"context (\d+) of", screen)
        if decode is None or used is None:
            raise RuntimeError(f"the cockpit shows no decode rate or context:\n{screen}")
        share = (cpu1 - cpu0) / (wall1 - wall0) if cpu0 is not None and cpu1 is not None else None
        return seconds, float(decode.group(1)), int(used.group(1)), share


class Chat(Side):
    SUMMARY = r"([\d.]+) tokens/s · ITL[^\n]*context (\d+)/"

    def __init__(self, model: list[str], tokens: int) -> None:
        super().__init__("chat", [sys.executable, "-m", "localllm", "chat", *model, "--temp", "0", "-n", str(tokens), "--system", "",
                                  "--vram", "4GiB", "--no-prompt-cache"], r">>>")

    def reply(self) -> tuple[float, float, int]:
        """Seconds from the first token on screen to the last (wall clock),
        decode t/s chat reports, tokens in context."""
        t = self.term
        t.send("/clear", literal=True)
        t.send("Enter")
        t.clear_history()  # the reply's summary is then the only one the pane has shown
        t.send(PROMPT, literal=True)
        t.wait_for(re.escape(PROMPT[-20:]), timeout=30)  # echoed whole: the reply is what follows it

        def replied(screen: str) -> bool:  # text after the prompt's line: the first token is on screen
            return bool(screen.rpartition(PROMPT[-20:])[2].partition("\n")[2].strip())

        t.send("Enter")
        seconds, screen = self.stream(replied, lambda sc: re.search(self.SUMMARY, sc), history=True)
        rate, used = re.search(self.SUMMARY, screen).groups()  # type: ignore[union-attr]
        return seconds, float(rate), int(used)


def long_reply() -> list[str]:
    """About 2,000 tokens with five code blocks, ending with "Done." right after the last block."""
    para = [" The", " quick", " brown", " fox", " uses", " `code`", " and", " **bold**", " words."] * 40 + ["\n\n"]
    block = ["```python\n"] + [f"def f{i}(x):\n    return x * {i}\n" for i in range(20)] + ["```\n\n"]
    return (para + block) * 5 + ["Done."]


def render_ms(model: str, tmp: Path) -> float:
    """Wall-clock ms from the reply's last token (the scripted engine's own
    stamp, CLOCK_MONOTONIC like this process's clock) to the final frame on
    screen (the reply drawn as Markdown: "Done." with no code fence left), in
    the cockpit on a scripted engine (1 ms between tokens), in tmux, the screen
    read back to back (each reading takes a few ms: the resolution)."""
    reply = tmp / "reply.json"
    reply.write_text(json.dumps(long_reply()))
    out = tmp / "out.json"
    term = Tmux([sys.executable, "-m", "tests.helpers.scripted_cockpit", model, str(out), str(reply), "--itl-ms=1"], env=_env())
    try:
        term.wait_for(r"context \d+ · KV", timeout=120)
        term.send("render", "Enter")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            screen = term.screen()
            now = time.perf_counter_ns()
            last = Path(f"{out}.last")
            if "Done." in screen and "```" not in screen and last.exists():
                return (now - int(last.read_text())) / 1e6
        raise TimeoutError(f"the reply was not drawn as Markdown:\n{term.screen()}")
    finally:
        term.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--poll-ms", type=float, default=50, help="how often the screen is read while a reply streams")
    ap.add_argument("--quick", action="store_true", help="one pair of 32-token replies: check that it completes and prints its figures")
    ap.add_argument("--render-only", action="store_true", help="only the time from the last token to the Markdown frame")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.tokens = 1, 32
    with tempfile.TemporaryDirectory() as d:
        # lazy: resolving a name loads the store; the benchmark's own imports stay light
        from localllm.store.resolver import resolve

        ms = render_ms(str(resolve(a.model)), Path(d))
    print(f"a finished 2,000-token reply with five code blocks, last token to the Markdown frame (wall clock, tmux): {ms:.0f} ms "
          f"{'ok' if ms <= 100 else 'ABOVE 100 ms'} (target <= 100)", flush=True)
    if a.render_only:
        return 0 if ms <= 100 else 1
    Side.poll = a.poll_ms / 1000
    model = [a.model] if a.model else []
    if a.quick:  # one thread each: a check that it completes, not a measure; two threads on a CPU another process
        model += ["--threads", "1"]  # uses wait at every op's barrier (3 t/s against 70 under the suite's other worker)
    tui: list[float] = []  # decode t/s inside llama_decode
    cli: list[float] = []
    tui_s: list[float] = []  # seconds from the first token on screen to the last
    cli_s: list[float] = []
    shares: list[float] = []
    cockpit = chat = None

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # the finally below resumes and closes both programs

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        cockpit = Cockpit(model, a.tokens)
        cockpit.pause()
        chat = Chat(model, a.tokens)
        for r in range(a.reps + 1):  # the first pair warms both up (page faults, caches): not counted
            for side in ((cockpit, chat) if r % 2 == 0 else (chat, cockpit)):
                other = chat if side is cockpit else cockpit
                other.pause()
                side.resume()
                if side is cockpit:
                    seconds, rate, used, share = cockpit.reply()
                    ui = "n/a" if share is None else f"{100 * share:.1f}% of a core"
                    line = f"  tui: {rate:.2f} t/s ({used} tokens in context; UI thread {ui} while it streamed)"
                    if r:
                        tui.append(rate)
                        tui_s.append(seconds)
                        shares += [share] if share is not None else []
                else:
                    seconds, rate, used = chat.reply()
                    line = f"  chat: {rate:.2f} t/s ({used} tokens in context)"
                    if r:
                        cli.append(rate)
                        cli_s.append(seconds)
                line += f" · on screen, first to last token: {1000 * seconds:.0f} ms"
                print(line + ("" if r else " [warm-up, not counted]"), flush=True)
    finally:
        for side in (cockpit, chat):
            if side is not None:
                side.close()
    t, c = statistics.median(tui), statistics.median(cli)
    pairs = sorted(x / y for x, y in zip(tui, cli))
    ratio = statistics.median(pairs)
    speeds = sorted(ch / tu for tu, ch in zip(tui_s, cli_s))  # the cockpit's streaming speed as a share of chat's
    speed = statistics.median(speeds)
    ts, cs = 1000 * statistics.median(tui_s), 1000 * statistics.median(cli_s)
    ui = f"UI thread {100 * statistics.median(shares):.1f}% of a core" if shares else "UI thread n/a"
    if a.quick:  # one short pair measures noise, not the cockpit: report, do not judge
        print(f"on screen, first to last token, quick (1 pair, {a.tokens} tokens): TUI {ts:.0f} ms · chat {cs:.0f} ms · "
              f"streaming speed TUI/chat {speed:.3f} (not judged)")
        print(f"decode t/s, quick (1 pair, {a.tokens} tokens): TUI {t:.2f} · chat {c:.2f} · ratio {ratio:.3f} (not judged) · {ui}")
        return 0
    ok = speed >= 0.95
    print(f"on screen, first to last token (wall clock), median of {a.reps}: TUI {ts:.0f} ms "
          f"(range {1000 * min(tui_s):.0f}-{1000 * max(tui_s):.0f}) · chat {cs:.0f} ms (range {1000 * min(cli_s):.0f}-{1000 * max(cli_s):.0f})")
    print(f"streaming speed TUI/chat (chat's time over the cockpit's), median of {a.reps} side-by-side pairs: {speed:.3f} "
          f"(range {speeds[0]:.3f}-{speeds[-1]:.3f}) {'ok' if ok else 'BELOW 0.95'}")
    print(f"decode t/s inside llama_decode, median of {a.reps}: TUI {t:.2f} · chat {c:.2f} · TUI/chat {ratio:.3f} "
          f"(range {pairs[0]:.3f}-{pairs[-1]:.3f}); {ui} (median) while a reply streamed")
    # Under load from other programs the pairs above vary by several times; each
    # program's on-screen speed over its own llama_decode rate in the same reply
    # does not, and shows the stalls between decodes alone. An estimate: it takes
    # every reply to have run to -n (the same context each time says they did alike).
    tui_eff = statistics.median((a.tokens - 1) / rate / sec for rate, sec in zip(tui, tui_s))
    cli_eff = statistics.median((a.tokens - 1) / rate / sec for rate, sec in zip(cli, cli_s))
    print(f"on-screen speed over llama_decode's, per reply (estimate: {a.tokens} tokens each), median: TUI {tui_eff:.3f} · "
          f"chat {cli_eff:.3f} · TUI/chat {tui_eff / cli_eff:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
