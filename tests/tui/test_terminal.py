"""End to end in a real terminal: tmux runs the cockpit, we type and read the screen."""

from __future__ import annotations

import re
import sys

import pytest

from scripts.tmuxdrive import Tmux, require
from tests.helpers.paths import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _require_tmux() -> None:
    require()  # fails, never skips, without tmux (scripts/install.sh --test installs it)



def _env(home) -> dict[str, str]:
    return {"LOCALLLM_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}


def test_bare_localllm_opens_the_cockpit(_isolated_home) -> None:
    with Tmux([sys.executable, "-m", "localllm"], env=_env(_isolated_home)) as t:
        t.wait_for(r"SmolLM2-135M-Instruct\.Q4_1\.gguf · context \d+", timeout=120)
        screen = t.screen()
        assert "Latency" in screen and "Memory" in screen and "Message (Enter sends" in screen
        t.send("C-q")


def test_chat_in_a_terminal_shows_numbers(_isolated_home) -> None:
    cmd = [sys.executable, "-m", "localllm", "tui", "--temp", "0", "--system", "Answer in one short sentence.", "--vram", "4GiB", "--ctx", "2048"]
    with Tmux(cmd, env=_env(_isolated_home)) as t:
        t.wait_for(r"context 2048 · KV f16/f16", timeout=120)
        t.send("What is the capital of France?", literal=True)
        t.send("Enter")
        t.wait_for(r"(is \d+% of the reply|slow \w+)", timeout=120)  # the verdict, drawn with the reply's final figures
        screen = t.screen()
        assert "Paris" in screen
        ttft = float(re.search(r"TTFT ([\d.]+) ms", screen).group(1))
        p50, p95 = (float(x) for x in re.search(r"ITL p50 ([\d.]+) ms · p95 ([\d.]+) ms", screen).groups())
        decode = float(re.search(r"decode ([\d.]+) t/s", screen).group(1))
        used = int(re.search(r"context (\d+) of 2048", screen).group(1))
        kv_now = re.search(r"KV now ([\d.]+) (KiB|MiB)", screen)
        assert ttft > 0 and 0 < p50 <= p95 and decode > 0 and used > 0 and kv_now
        assert "GPU budget (--vram) 4.00 GiB" in screen
        t.send("C-q")


def test_pull_shows_a_progress_bar_and_ctrl_c_keeps_the_part(_isolated_home, tmp_path) -> None:
    """In a real terminal: the bar moves, Ctrl+C stops the download with one line
    and exit 130, and the next run resumes from what was kept."""
    import os
    import shlex

    from scripts.synth_gguf import SynthSpec, write_llama_gguf
    from tests.helpers.fake_hub import FakeHub

    model = write_llama_gguf(tmp_path / "Synth-F32.gguf", SynthSpec(n_layer=4, n_embd=256, n_ff=512))
    hub = FakeHub(trickle=0.05).start()
    hub.add("acme/Synth-GGUF", "Synth-F32.gguf", model)
    env = {**_env(_isolated_home), "HF_ENDPOINT": hub.endpoint, "HF_HOME": os.environ["HF_HOME"]}
    # bash waits out a child that handled Ctrl+C itself, so it can report the exit status
    pull = ["bash", "-c", f"{shlex.quote(sys.executable)} -m localllm pull acme/Synth-GGUF; echo EXIT=$?; sleep 60"]
    try:
        with Tmux(pull, env=env) as t:
            t.wait_for(r"Synth-F32\.gguf.*━.*\s([1-9]\d?)%", timeout=60)  # rich's bar, between 1% and 99%
            t.send("C-c")
            t.wait_for(r"EXIT=130", timeout=30)
            screen = t.screen()
            assert "kept; run the same command to resume" in screen and "Traceback" not in screen
        hub.trickle = 0.0
        with Tmux(pull, env=env) as t:
            t.wait_for(r"EXIT=0", timeout=60)
            assert "resumed after" in t.screen() and "sha256 verified" in t.screen()
        assert hub.ranges() and hub.ranges()[-1] != "bytes=0-"
    finally:
        hub.stop()


@pytest.mark.all_cpus  # the cockpit and the tmux server drawing it: on one pinned CPU, tmux's backlog of a 1 ms-per-token
# stream delayed the final frame by 8-52 s under xdist (alone: 96 ms); every CPU, as a user's terminal has
def test_bench_tui_quick_completes() -> None:
    """scripts/bench_tui.py --quick: the cockpit and ``localllm chat`` each
    answer a warm-up and a counted 32-token reply in tmux, the same tokens
    (greedy, each from an empty chat), and the script prints both rates and
    the cockpit's UI thread share (it once waited forever when a line came
    between the decode rate and the verdict)."""
    import subprocess

    r = subprocess.run([sys.executable, "scripts/bench_tui.py", "--quick"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    tui = re.findall(r"tui: ([\d.]+) t/s \((\d+) tokens in context; UI thread ([\d.]+% of a core|n/a) while it streamed\)", r.stdout)
    chat = re.findall(r"chat: ([\d.]+) t/s \((\d+) tokens in context\)", r.stdout)
    assert len(tui) == len(chat) == 2, r.stdout  # a warm-up and a counted reply each
    assert all(float(rate) > 0 for rate, *_ in tui + chat), r.stdout
    assert len({used for _, used, *_ in tui + chat}) == 1, r.stdout  # the same prompt and reply on both sides, every time
    if sys.platform == "linux":  # the UI thread's CPU time, read from /proc: it drew, and took less than a core
        assert all(0 < float(share.split("%")[0]) < 100 for *_, share in tui), r.stdout
    assert re.search(r"decode t/s, quick \(1 pair, 32 tokens\): TUI [\d.]+ · chat [\d.]+ · ratio [\d.]+ \(not judged\) · UI thread ([\d.]+% of a core|n/a)",
                     r.stdout)
    # the wall clock from the first token on screen to the last, for each reply: at least the 31 gaps at a generous 1000 t/s
    stream = [int(ms) for ms in re.findall(r"on screen, first to last token: (\d+) ms", r.stdout)]
    assert len(stream) == 4 and all(ms >= 31 for ms in stream), r.stdout
    # and the Markdown render of a long reply, from the engine's last token to the frame on screen
    render = re.search(r"last token to the Markdown frame \(wall clock, tmux\): (\d+) ms", r.stdout)
    assert render and 0 < int(render.group(1)) < 1000, r.stdout
    assert re.search(r"on screen, first to last token, quick \(1 pair, 32 tokens\): TUI \d+ ms · chat \d+ ms · "
                     r"streaming speed TUI/chat [\d.]+ \(not judged\)", r.stdout)
