"""The cockpit over llama.cpp RPC workers (``localllm tui --rpc``): a worker
that is down or a malformed value stops it before the screen opens; one memory
bar per device, with llama.cpp's own figures; a worker that dies mid-reply ends
the reply with one line and the cockpit stays up; and after every load the
memory panel says whether llama.cpp allocated what the plan said."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.plan.planner import MiB
from localllm.tui.app import create_app
from localllm.tui.devices import DeviceBars
from localllm.tui.settings import Settings
from localllm.util.fmt import size
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.tui import panel_text, send, until, wait_idle
from tests.helpers.workers import WorkerProc, free_port


@pytest.mark.slow
def test_tui_worker_down_is_one_line_before_the_screen() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli("tui", "--rpc", f"127.0.0.1:{port}")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"localllm: error: worker 127.0.0.1:{port} refused the connection: is `localllm worker --port {port}` running there?"
    ]
    assert proc.stdout == "" and time.monotonic() - t0 < 30  # no screen was drawn


@pytest.mark.parametrize("value", ["127.0.0.1", "host:99999", "a:1,,b:2"])
def test_tui_malformed_rpc_is_a_usage_error(value: str) -> None:
    proc = run_cli("tui", "--rpc", value)
    assert proc.returncode == 2, proc.stderr
    assert "--rpc" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def worker():
    w = WorkerProc()
    yield w
    w.stop()


def bar_rows(app) -> list[str]:
    return [str(r) for r in app.query_one(DeviceBars).rows(46)]  # the side panel's width inside its border


@pytest.mark.slow
async def test_one_bar_per_device_with_llama_cpp_figures(worker, smollm2: Path) -> None:
    """Full offload to one loopback worker: a bar for the worker's device and
    one for the CPU; each bar's weights and KV figures are what llama.cpp
    printed for that device (its log), the budget is the free memory the worker
    reported; KV now grows with the chat."""
    app = create_app(str(smollm2), settings=Settings(n_ctx=2048, threads=1, temperature=0.0, max_tokens=8, system_prompt=""), rpc=[worker.ep], bandwidth=20e9)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_idle(app, pilot)
        logged = app.backend.logged_buffers
        name = f"RPC0[{worker.ep}]"
        rows = bar_rows(app)
        assert len(rows) == 8 and rows[0].startswith(f"{name}  free ") and rows[4].startswith("CPU  free ")
        assert all(len(r) <= 46 for r in rows) and not any(r.endswith("…") for r in rows)
        assert f"weights {logged[name]['model'][0]:.2f} MiB" in rows[2] and f"of {logged[name]['KV'][0]:.2f} MiB · 31/31 layers" in rows[3]
        assert f"weights {logged['CPU']['model'][0]:.2f} MiB" in rows[6] and rows[7] == "■ KV none · 0/31 layers"
        pl = app.footprint.placement
        assert pl.uses[0].device.free_bytes > 0 and f"free {pl.uses[0].device.free_bytes / 1024**3:.2f} GiB" in rows[0]
        assert rows[3].startswith("■ KV 0 B of")
        text = panel_text(app)
        assert f"2 devices: {name}, CPU" in text and "llama.cpp allocated as planned (within 1%)" in text
        assert not app.query_one("BudgetBar").display  # the one-budget bar gives way to the device bars

        await send(app, pilot, "Hi")
        await wait_idle(app, pilot)
        per_token = pl.plan.kv_bytes_per_token
        await until(pilot, lambda: f"KV {size(app.chat.context_used * per_token)} of" in bar_rows(app)[3], "showed the chat's KV cache on the worker's bar",
                    timeout=30, detail=lambda: bar_rows(app)[3])
        used = app.chat.context_used
        assert used > 0 and f"KV {size(used * per_token)} of" in bar_rows(app)[3]  # 22.50 KiB a token on SmolLM2, f16


@pytest.mark.slow
def test_worker_dies_mid_reply_cockpit_stays_up(tmp_path: Path) -> None:
    """Kill the worker's process during a reply: the reply ends with one line
    in the chat, Enter and the settings screen still answer, the chat is saved,
    and the cockpit quits at once. The Pilot session runs in its own process
    (tests/helpers/cockpit_worker_death.py): llama.cpp holds a thread for good after it
    aborts, so that process leaves with os._exit, as `localllm tui` does."""
    w = WorkerProc()
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "helpers" / "cockpit_worker_death.py"), str(w.port), str(w.proc.pid)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        w.stop()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # llama.cpp's own lines stay off the terminal
    out = json.loads(proc.stdout)
    assert out["loaded"] and out["started"] and out["ended"] and out["end_s"] < 10
    assert out["reply"].startswith(out["text_at_kill"])  # what was shown stays shown
    lost = [n for n in out["notes"] if n.startswith("error:")]
    assert lost == [
        "error: a worker stopped answering (Remote RPC server crashed or returned malformed response) · "
        "the model is lost (the chat is saved: F4); quit (Ctrl+Q) and start the cockpit again to load one"
    ]
    assert out["reload"] and len(out["after"]) == 3, out["after"]
    assert out["after"][0] == "no model is loaded: F2 picks one" and out["after"][1].startswith("loading ")
    assert "llama.cpp still holds the connection to the worker that stopped: quit (Ctrl+Q)" in out["after"][2]
    assert out["settings_screen"] == "SettingsScreen" and out["back"] == "Screen"
    assert out["quit_s"] < 5 and out["parked"] is True
    assert out["saved"][-2]["role"] == "user" and out["saved"][-1] == {"role": "assistant", "content": out["reply"]}


@pytest.mark.slow
async def test_memory_panel_says_when_llama_cpp_allocated_what_the_plan_said(smollm2: Path) -> None:
    app = create_app(str(smollm2), settings=Settings(n_ctx=1024, threads=1, system_prompt=""), bandwidth=20e9)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_idle(app, pilot)
        assert app.memory_check is not None and app.memory_check.ok
        text = panel_text(app)
        assert "llama.cpp allocated as planned (within 1%)" in text and "plan ≠ llama.cpp" not in text


@pytest.mark.slow
async def test_memory_panel_shows_both_figures_when_the_plan_is_off(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's compute figure made 20% too large (the planner patched, not
    llama.cpp): the panel names the buffer with both figures."""
    from dataclasses import replace

    from localllm.plan import planner

    real = planner.plan_memory
    monkeypatch.setattr(planner, "plan_memory", lambda *a, **k: replace(p := real(*a, **k), compute_bytes=int(p.compute_bytes * 1.2)))
    app = create_app(str(smollm2), settings=Settings(n_ctx=1024, threads=1, system_prompt=""), bandwidth=20e9)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_idle(app, pilot)
        logged = app.backend.logged_buffers["CPU"]["compute"][0]
        planned = app.memory_check.buffers[[b.buffer for b in app.memory_check.buffers].index("compute")].planned_bytes
        text = panel_text(app)
        assert f"plan ≠ llama.cpp: compute buffer planned {planned / MiB:.2f} MiB, llama.cpp allocated {logged:.2f} MiB" in text
        assert "allocated as planned" not in text
        assert abs(planned / MiB / logged - 1.2) < 0.02


@pytest.mark.slow
def test_worker_dies_in_a_real_terminal_then_quit(_isolated_home: Path) -> None:
    """`localllm tui --rpc` in tmux: the worker killed mid-reply, the screen
    shows the one line (nothing of llama.cpp's scribbled over it), Ctrl+Q quits
    at once with status 0 (the process leaves although llama.cpp holds a thread)."""
    import shlex

    from scripts.tmuxdrive import Tmux, require

    require()
    w = WorkerProc()
    cmd = " ".join(
        shlex.quote(c)
        for c in [sys.executable, "-m", "localllm", "tui", "--rpc", str(w.ep), "--temp", "0", "--ctx", "2048", "--threads", "1", "-n", "1500", "--system", ""]
    )
    env = {"LOCALLLM_HOME": str(_isolated_home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    try:
        with Tmux(["sh", "-c", f"{cmd}; echo EXIT=$?; sleep 60"], env=env) as t:
            t.wait_for(r"context 2048 · KV f16/f16", timeout=120)
            t.wait_for(re.escape(f"RPC0[{w.ep}]  free"), timeout=10)  # the device bars
            t.wait_for("llama.cpp allocated as planned", timeout=10)
            t.send("Write a very long story about a lighthouse keeper, with many chapters.", literal=True)
            t.send("Enter")
            t.wait_for(r"TTFT [\d.]+ ms", timeout=60)  # the reply has started
            t.wait_for(r"ITL p50 [\d.]+ ms", timeout=60)  # and streams: two tokens or more
            w.proc.kill()
            t.wait_for(r"error: a worker stopped answering", timeout=30)
            screen = t.screen()
            assert "recv failed" not in screen and "Remote RPC server crashed" in screen
            t0 = time.monotonic()
            t.send("C-q")
            t.wait_for(r"EXIT=0", timeout=20)
            assert time.monotonic() - t0 < 10
    finally:
        w.stop()


def test_memory_check_per_device_names_the_device_and_both_figures(smollm2: Path) -> None:
    """memcheck.check_placement, which the cockpit, run and doctor use over
    --rpc: a device whose compute buffer llama.cpp printed 5% larger than the
    plan, and a device that logged no KV buffer where the plan has one, are
    both flagged, each with the device's name and both figures."""
    from localllm.engine_api import LoadConfig
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan.memcheck import check_placement
    from localllm.plan.placement import Device, place
    from localllm.plan.planner import ModelShape

    header = read_header(smollm2)
    cfg = LoadConfig(n_ctx=2048, n_gpu_layers=12)
    pl = place(ModelShape.from_header(header), cfg, [Device("RPC0[a:1]", "rpc", None)], Device("CPU", "cpu", None), header=header)
    rpc, cpu = pl.uses
    assert rpc.kv_bytes and cpu.kv_bytes and rpc.compute_bytes and cpu.output_bytes

    def line(dev: str, kind: str, n: float) -> str:
        return f"llama_x: {dev} {kind} buffer size = {n / MiB:8.2f} MiB"

    lines = [
        line("RPC0[a:1]", "KV", rpc.kv_bytes),
        line("CPU", "KV", cpu.kv_bytes),
        line("RPC0[a:1]", "compute", rpc.compute_bytes),
        line("CPU", "compute", cpu.compute_bytes),
        line("CPU", "output", cpu.output_bytes),
    ]
    assert check_placement(pl, lines).ok
    off = [ln for ln in lines if "CPU KV" not in ln and "RPC0[a:1] compute" not in ln] + [line("RPC0[a:1]", "compute", rpc.compute_bytes * 1.05)]
    mc = check_placement(pl, off)
    assert not mc.ok
    assert mc.mismatch_lines() == [
        f"memory check: RPC0[a:1] compute buffer planned {rpc.compute_bytes / MiB:.2f} MiB, llama.cpp allocated {rpc.compute_bytes * 1.05 / MiB:.2f} MiB",
        f"memory check: CPU kv buffer planned {cpu.kv_bytes / MiB:.2f} MiB, llama.cpp allocated n/a",
    ]
