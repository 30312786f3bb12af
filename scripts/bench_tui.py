"""Does the cockpit slow the stream? Decode t/s shown by the TUI against
``localllm run`` streaming the same reply, both in a real terminal (tmux, same
size), same model, prompt and settings (greedy, so both generate the same
tokens), alternating, side by side. Target: ratio >= 0.95.

Both run in the terminal because drawing text costs CPU in the terminal too
(tmux's own process): comparing against ``run`` writing into a pipe would
charge that cost to the TUI alone.

On a 2-core machine one run's decode rate varies by several percent from the
next, so the ratio of medians moves by a few percent between invocations: use
``--reps 5`` or more. The steadier figure is the cockpit's own cost: the CPU
time of its UI thread (Textual's event loop: it computes and draws every
frame) while the reply streamed, read from /proc on Linux. llama.cpp's decode
threads use every core, so that time comes out of decoding.

    python scripts/bench_tui.py [--model smollm2] [--tokens 256] [--reps 5]
    python scripts/bench_tui.py --quick    # one repetition, 32 tokens: checks it completes (no verdict on the ratio)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
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


def tui_rate(model: list[str], tokens: int) -> tuple[float, int, float | None]:
    """Decode t/s the cockpit shows, tokens in context, and the share of one
    core its UI thread used from Enter to the reply's final figures."""
    cmd = [sys.executable, "-m", "localllm", "tui", *model, "--temp", "0", "-n", str(tokens), "--system", "", "--vram", "4GiB"]
    with Tmux(cmd, env=_env()) as t:
        t.wait_for(r"context \d+ · KV", timeout=120)
        pid = t.pane_pid()  # env(1) execs python: the pane's process is the cockpit
        cpu0, wall0 = _cpu_seconds(pid), time.monotonic()
        t.send(PROMPT, literal=True)
        t.send("Enter")
        # The verdict is drawn with the reply's final figures: wait for it, then
        # read them from that same screen (other lines, e.g. the roofline, may
        # stand between the decode rate and the verdict).
        t.wait_for(r"slow (start|stream)", timeout=300, interval=1.0)
        cpu1, wall1 = _cpu_seconds(pid), time.monotonic()
        screen = t.screen()
        decode = re.search(r"decode ([\d.]+) t/s", screen)
        used = re.search(r"context (\d+) of", screen)
        if decode is None or used is None:
            raise RuntimeError(f"the cockpit shows no decode rate or context:\n{screen}")
        share = (cpu1 - cpu0) / (wall1 - wall0) if cpu0 is not None and cpu1 is not None else None
        return float(decode.group(1)), int(used.group(1)), share


def run_rate(model: list[str], tokens: int) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "localllm", "run", *model, "--temp", "0", "-n", str(tokens), "--vram", "4GiB", "-p", PROMPT]
    shell = ["bash", "-c", " ".join(f"'{c}'" for c in cmd) + "; sleep 600"]
    with Tmux(shell, env=_env()) as t:
        rate = float(t.wait_for(r"eval rate:\s+([\d.]+) tokens/s\s*\n[^\n]*time to first", timeout=300, interval=1.0).group(1))
        count = int(t.wait_for(r"\n\s*eval count:\s+(\d+)").group(1))
        prompt = int(t.wait_for(r"prompt eval count:\s+(\d+)").group(1))
        return rate, prompt + count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one repetition of 32 tokens: check that it completes and prints its figures")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.tokens = 1, 32
    model = [a.model] if a.model else []
    tui: list[float] = []
    cli: list[float] = []
    shares: list[float] = []
    for r in range(a.reps):
        for which in (("tui", "run") if r % 2 == 0 else ("run", "tui")):
            if which == "tui":
                rate, used, share = tui_rate(model, a.tokens)
                tui.append(rate)
                shares += [share] if share is not None else []
                ui = "n/a" if share is None else f"{100 * share:.1f}% of a core"
                print(f"  tui: {rate:.2f} t/s ({used} tokens in context; UI thread {ui} while it streamed)", flush=True)
            else:
                rate, used = run_rate(model, a.tokens)
                cli.append(rate)
                print(f"  run: {rate:.2f} t/s ({used} tokens in context)", flush=True)
    t, c = statistics.median(tui), statistics.median(cli)
    ok = t / c >= 0.95
    ui = f"UI thread {100 * statistics.median(shares):.1f}% of a core" if shares else "UI thread n/a"
    if a.quick:  # one short repetition measures noise, not the cockpit: report, do not judge
        print(f"decode t/s, quick (1 repetition, {a.tokens} tokens): TUI {t:.2f} · run {c:.2f} · ratio {t / c:.3f} (not judged) · {ui}")
        return 0
    pairs = sorted(x / y for x, y in zip(tui, cli))
    print(f"decode t/s, median of {a.reps}: TUI {t:.2f} (range {min(tui):.2f}-{max(tui):.2f}) · run {c:.2f} "
          f"(range {min(cli):.2f}-{max(cli):.2f}) · ratio {t / c:.3f} {'ok' if ok else 'BELOW 0.95'}")
    print(f"  side-by-side pairs: ratio median {statistics.median(pairs):.3f}, range {pairs[0]:.3f}-{pairs[-1]:.3f}; "
          f"{ui} (median) while a reply streamed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
