"""CLI tables and progress bars come from rich: columns aligned by terminal cell
width (CJK names), and ``pull`` and ``quantize`` draw the same kind of bar on a
terminal and plain lines when piped."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from localllm.util import fmt
from localllm.util.progress import Bar
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub
from tests.helpers.paths import REPO


def _starts(line: str, cell: str) -> int:
    """The terminal cell at which ``cell`` begins on ``line``."""
    return cell_len(line[: line.index(cell)])


def test_columns_align_by_terminal_cells() -> None:
    rows = [("模型一号:q4_k_m", "1.00 GiB", "/a"), ("abc", "10 B", "/b"), ("éte\u0301", "5 B", "/c")]
    lines = fmt.table(("NAME", "SIZE", "PATH"), rows, right=(1,)).splitlines()
    # len() counts 模 as one and e + U+0301 as two: its padding misplaced both rows
    assert len(rows[0][0]) != cell_len(rows[0][0]) and len(rows[2][0]) != cell_len(rows[2][0])
    ends = {cell_len(line[: line.index(c) + len(c)]) for line, c in zip(lines, ("SIZE", "1.00 GiB", "10 B", "5 B"))}
    assert len(ends) == 1  # the right-aligned column ends in the same cell on every line
    assert len({_starts(line, c) for line, c in zip(lines, ("PATH", "/a", "/b", "/c"))}) == 1
    assert lines[1].startswith("模型一号:q4_k_m  ")  # two spaces between columns, as before
    assert "[bold]" in fmt.table(("A",), [("[bold]x",)])  # names are text, never rich markup


@pytest.mark.slow
def test_list_aligns_a_cjk_model_name(synth_model: Path, tmp_path: Path) -> None:
    f = tmp_path / "模型-Q8_0.gguf"
    f.write_bytes(synth_model.read_bytes())
    assert cli("add", str(f)).returncode == 0
    r = cli("list", "--vram", "4GiB", env={"COLUMNS": "250"})  # wide enough for every column
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith(("NAME", "模型", "smollm2"))]
    assert len(lines) >= 2 and any(line.startswith("模型") for line in lines)
    for col in ("SOURCE", "PATH"):
        head = _starts(lines[0], col)
        word = {"SOURCE": ("added", "embedded"), "PATH": ("/",)}[col]
        assert all(_starts(line, next(w for w in word if w in line)) == head for line in lines[1:]), lines


# -- progress ----------------------------------------------------------------------------


def test_piped_progress_is_plain_lines_at_the_start_the_end_and_each_quarter() -> None:
    out = io.StringIO()
    bar = Bar("quantizing", 8, unit="tensors", stream=out, interval=0)
    for i in range(1, 9):
        bar.update(i, f"blk.{i}.weight")
    bar.close()
    assert out.getvalue().splitlines() == [
        "quantizing: 0/8 tensors (0%)", "quantizing: 2/8 tensors (25%)", "quantizing: 4/8 tensors (50%)",
        "quantizing: 6/8 tensors (75%)", "quantizing: 8/8 tensors (100%)",
    ]
    out = io.StringIO()
    bar = Bar("downloading x.gguf", 4 << 20, stream=out, done=2 << 20)  # quarters only every 5 s: a quick run is two lines
    for n in range(2 << 20, 4 << 20, 1 << 18):
        bar.update(n)
    bar.update(4 << 20)
    assert out.getvalue().splitlines() == ["downloading x.gguf: 2.00 MiB of 4.00 MiB (50%)", "downloading x.gguf: 4.00 MiB of 4.00 MiB (100%)"]
    out = io.StringIO()
    Bar("x", 10, stream=out, enabled=False).update(10)
    assert out.getvalue() == ""


def _on_a_terminal(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout piped); returns
    (exit code, what the terminal showed, stdout)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "localllm", *args], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", **(env or {})})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace"), stdout


def _is_rich_bar(screen: str) -> bool:
    return "━" in screen and "100%" in screen and "\x1b[" in screen


@pytest.fixture
def f16(tmp_path: Path) -> Path:
    return write_llama_gguf(tmp_path / "Synth-F16.gguf", SynthSpec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, dtype="f16"))


@pytest.mark.slow
def test_pull_and_quantize_draw_the_same_bar_on_a_terminal(f16: Path, tmp_path: Path) -> None:
    hub = FakeHub().start()
    try:
        hub.add("acme/Synth-GGUF", "Synth-F16.gguf", f16)
        rc, screen, stdout = _on_a_terminal(["pull", "acme/Synth-GGUF:F16"], env={"HF_ENDPOINT": hub.endpoint})
    finally:
        hub.stop()
    assert rc == 0, screen
    assert _is_rich_bar(screen) and "downloading" in screen and "(25%)" not in screen, screen
    assert "\x1b" not in stdout and stdout.startswith("synth:f16\t")  # the bar stays off stdout
    rc, screen, _ = _on_a_terminal(["quantize", str(f16), str(tmp_path / "out-Q8_0.gguf"), "--type", "Q8_0"])
    assert rc == 0, screen
    assert _is_rich_bar(screen) and "quantizing" in screen and "tensors" in screen and "(25%)" not in screen, screen


@pytest.mark.slow
def test_piped_quantize_prints_plain_lines(f16: Path, tmp_path: Path) -> None:
    r = cli("quantize", str(f16), str(tmp_path / "out-Q8_0.gguf"), "--type", "Q8_0")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("quantizing")]
    assert lines[0].startswith("quantizing: ") and lines[-1].endswith("tensors (100%)") and len(lines) <= 5, r.stderr
    assert "\x1b" not in r.stderr and "\r" not in r.stderr
    j = cli("quantize", str(f16), str(tmp_path / "out2-Q8_0.gguf"), "--type", "Q8_0", "--json")
    assert j.returncode == 0 and "quantizing" not in j.stderr
