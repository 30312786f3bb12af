"""Interrupted quantization leaves nothing: SIGKILL, SIGTERM, and stale partial files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def f16_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An F16 model big enough that quantizing it with one thread takes a while."""
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    return write_llama_gguf(tmp_path_factory.mktemp("q") / "big-F16.gguf",
                            SynthSpec(n_layer=24, n_embd=512, n_head=8, n_head_kv=8, n_ff=2048, dtype="f16"))


def _start_quantize(src: Path, out: Path) -> tuple[subprocess.Popen[str], int]:
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "localllm", "quantize", str(src), str(out), "--type", "Q4_K_M", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "quantizing: 1/N tensors": the real run has begun
    assert line.startswith("quantizing"), line + proc.stderr.read()
    workers = [c for c in psutil.Process(proc.pid).children() if "localllm.quantize.worker" in " ".join(c.cmdline())]
    assert len(workers) == 1
    return proc, workers[0].pid


def _gone(pid: int, within: float) -> bool:
    import psutil

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_sigkill_of_quantize_stops_its_worker_and_the_next_run_cleans_up(f16_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out-Q4_K_M.gguf"
    proc, worker = _start_quantize(f16_source, out)
    proc.kill()
    proc.wait(timeout=30)
    try:
        assert _gone(worker, 10), "the worker outlived its parent"
    finally:
        if not _gone(worker, 0.1):
            os.kill(worker, signal.SIGKILL)
    stale = list(tmp_path.glob(".out-Q4_K_M.gguf.partial-*"))
    assert len(stale) == 1  # a SIGKILL cannot clean up: the next run must
    other = tmp_path / "other-Q8_0.gguf"
    done = run_cli("quantize", str(f16_source), str(other), "--type", "Q8_0", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-Q8_0.gguf"]


@pytest.mark.slow
def test_sigterm_of_quantize_cleans_up_at_once(f16_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out-Q4_K_M.gguf"
    proc, worker = _start_quantize(f16_source, out)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=60) == 143, rest
    assert "terminated" in rest and "Traceback" not in rest
    assert _gone(worker, 10)
    assert list(tmp_path.iterdir()) == []


def test_stale_partials_of_live_processes_are_kept(tmp_path: Path) -> None:
    from localllm.quantize.pipeline import remove_stale_partials

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".a.gguf.partial-{dead.pid}").write_bytes(b"x")
    (tmp_path / f".b.gguf.partial-{os.getpid()}").write_bytes(b"x")
    (tmp_path / "keep.gguf").write_bytes(b"x")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".c.gguf.partial-{live.pid}").write_bytes(b"x")
        remove_stale_partials(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".c.gguf.partial-{live.pid}", "keep.gguf"]
    finally:
        live.kill()
        live.wait()
