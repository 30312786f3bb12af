"""More than one device: llama.cpp's RPC backend, served by ``localllm worker``
processes on 127.0.0.1, and the per-device placement checked against what
llama.cpp allocates on each device (its log)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.errors import UsageError
from localllm.modelfile.gguf_file import read_header
from localllm.plan.placement import Device, layer_devices, place
from localllm.plan.planner import MiB, ModelShape
from localllm.plan.workers import Endpoint, parse_endpoints, probe
from tests.helpers.cli import run_cli
from tests.helpers.paths import REPO
from tests.helpers.workers import WorkerProc, free_port


@pytest.fixture(scope="module")
def workers():
    ws = [WorkerProc(), WorkerProc()]
    yield ws
    for w in ws:
        w.stop()


# -- parsing and refusing, no worker needed ------------------------------------------


def test_parse_endpoints() -> None:
    assert parse_endpoints("127.0.0.1:50052") == [Endpoint("127.0.0.1", 50052)]
    assert parse_endpoints("a.local:1, 10.0.0.2:65535") == [Endpoint("a.local", 1), Endpoint("10.0.0.2", 65535)]
    for bad in ("", "127.0.0.1", "127.0.0.1:", ":50052", "h:0", "h:65536", "h:x", "h:1,", "[::1]:50052", "h:1,h:1", "a b:1"):
        with pytest.raises(UsageError):
            parse_endpoints(bad)


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:", "host:99999", "[::1]:50052", "a:1,,b:2"])
def test_malformed_rpc_is_a_usage_error(value: str) -> None:
    proc = run_cli("plan", "--rpc", value)
    assert proc.returncode == 2, proc.stderr
    assert "--rpc" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_worker_refuses_open_host_without_the_flag() -> None:
    proc = run_cli("worker", "--host", "0.0.0.0", "--port", str(free_port()))
    assert proc.returncode == 2
    assert "no authentication" in proc.stderr and "--i-understand-this-is-open" in proc.stderr
    proc = run_cli("worker", "--host", "localhost")
    assert proc.returncode == 2 and "IPv4" in proc.stderr


@pytest.mark.slow
def test_worker_down_is_one_line_before_any_load(smollm2: Path) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli("run", "--rpc", f"127.0.0.1:{port}", "-p", "hi", "-n", "1")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"localllm: error: worker 127.0.0.1:{port} refused the connection: is `localllm worker --port {port}` running there?"
    ]
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_silent_worker_times_out_instead_of_hanging() -> None:
    """A port that accepts and never answers (a worker busy with another client
    looks like this): one line, exit 1, within the probe timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    try:
        t0 = time.monotonic()
        proc = run_cli("plan", "--rpc", f"127.0.0.1:{port}")
        assert proc.returncode == 1
        assert "did not answer within" in proc.stderr and "one client at a time" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 30
    finally:
        srv.close()


def test_layer_split_follows_llama_cpp() -> None:
    # 30 layers + output over two equal devices: llama.cpp's upper_bound on i/31.
    where = layer_devices(30, -1, [1.0, 1.0])
    assert where[:16] == [0] * 16 and where[16:] == [1] * 15  # 15/31 < 0.5 <= 16/31
    where = layer_devices(30, 12, [1.0])
    assert where[:19] == [None] * 19 and where[19:] == [0] * 12  # the last 12 of 31: 11 layers and the output
    assert layer_devices(30, 0, [1.0]) == [None] * 31
    assert layer_devices(30, -1, [3.0, 1.0]).count(0) == 24  # float32 3/4 of 31 -> layers 0..23


# -- placement against what llama.cpp allocates on each device ----------------------


def _load_and_log(path: Path, cfg, eps: list[str], split: tuple[float, ...]):
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig

    with LlamaCppBackend() as b:
        b.load(path, LoadConfig(**{**cfg.to_dict(), "rpc_servers": tuple(eps), "tensor_split": split}))
        return b.logged_buffers


def _compare(path: Path, cfg, eps: list[str]) -> list[str]:
    """Weights and KV per device equal to llama.cpp's printed figure (0.01 MiB),
    compute within 5%; returns what differs."""

    header = read_header(path)
    shape = ModelShape.from_header(header)
    split = (1.0,) * len(eps)
    devices = [Device(f"RPC0[{ep}]", "rpc", None) for ep in eps]
    pl = place(shape, cfg, devices, Device("CPU", "cpu", None), list(split), header=header)
    logged = _load_and_log(path, cfg, eps, split)
    wrong = []
    for u in pl.uses:
        got = logged.get(u.device.name, {})
        if u.device.kind == "cpu":
            # CPU_Mapped first; a CPU_REPACK copy (the CPU's instruction set decides) is not planned.
            weights = [round(u.mapped_bytes / MiB, 2)]
            printed_w = got.get("model", [])[:1]
        else:
            weights = [round(u.weights_bytes / MiB, 2)] if u.weights_bytes else []
            printed_w = got.get("model", [])
        kv = [round(b / MiB, 2) for b in u.kv_by_cache]
        if weights != printed_w or kv != got.get("KV", []):
            wrong.append(f"{u.device.name}: weights {weights} vs {printed_w}, KV {kv} vs {got.get('KV', [])}")
        printed_c = got.get("compute", [0.0])[0]
        est = u.compute_bytes / MiB
        if abs(est - printed_c) > 0.05 * printed_c or (printed_c == 0 and est > 0.01):
            wrong.append(f"{u.device.name}: compute {est:.2f} vs {printed_c} MiB")
        if u.device.kind == "cpu" and [round(u.output_bytes / MiB, 2)] != got.get("output"):
            wrong.append(f"CPU: output {u.output_bytes / MiB:.2f} vs {got.get('output')}")
    return wrong


SMOL_CASES = [  # (n_gpu_layers, workers, cache type, n_outputs_max, n_ctx, n_ubatch)
    (-1, 1, "f16", 1, 4096, 512),  # everything on one worker, the output layer too
    (-1, 2, "f16", 1, 4096, 512),  # split in two: pipeline parallelism
    (-1, 2, "q8_0", 0, 1000, 512),  # a quantized cache; every row an output
    (12, 1, "f16", 1, 4096, 512),  # partial: 11 layers and the output layer remote
    (12, 2, "f16", 0, 4096, 512),  # partial over two workers
    (1, 2, "f16", 1, 4096, 512),  # only the output layer offloaded
    (0, 1, "f16", 1, 4096, 512),  # nothing offloaded: the worker holds nothing
]
GEMMA_CASES = [
    (-1, 1, "f16", 1, 4096, 512),
    (-1, 2, "q8_0", 1, 4096, 512),
    (12, 2, "f16", 1, 4096, 128),
    (7, 2, "q8_0", 0, 1000, 512),  # the first worker holds only sliding-window layers
]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_placement_matches_llama_cpp_per_device(model: str, workers, smollm2: Path, gemma: Path) -> None:
    from localllm.engine_api import LoadConfig

    path, cases = (smollm2, SMOL_CASES) if model == "smollm2" else (gemma, GEMMA_CASES)
    eps = [str(w.ep) for w in workers]
    wrong = []
    for ngl, n_workers, kv, n_out, n_ctx, ub in cases:
        cfg = LoadConfig(n_ctx=n_ctx, n_ubatch=ub, n_gpu_layers=ngl, type_k=kv, type_v=kv, n_outputs_max=n_out, flash_attn="on", n_threads=1)
        wrong += [f"ngl {ngl} x{n_workers} {kv} out {n_out} ctx {n_ctx} ub {ub}: {w}" for w in _compare(path, cfg, eps[:n_workers])]
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_plan_and_run_over_two_workers(workers, smollm2: Path) -> None:
    """plan --rpc shows each worker's device with its free memory; run --rpc
    answers, and its --json devices agree with llama.cpp's log."""
    rpc = ",".join(str(w.ep) for w in workers)
    proc = run_cli("plan", "--rpc", rpc, "--ctx", "2048", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    names = [x["name"] for x in d["devices"]]
    assert names == [f"RPC0[{w.ep}]" for w in workers] + ["CPU"]
    assert all(x["free_bytes"] > 0 for x in d["devices"]) and d["fits"] is True
    assert sum(x["layers"] for x in d["devices"]) == 30 and d["devices"][1]["output_layer"] is True

    text = run_cli("plan", "--rpc", rpc, "--ctx", "2048").stdout
    assert f"RPC0[{workers[0].ep}]" in text and "free" in text

    proc = run_cli("run", "--rpc", rpc, "--ctx", "2048", "--raw", "-p", "The capital of France is", "-n", "3", "--temp", "0", "--json", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "Paris" in out["text"]
    for i, dev in enumerate(out["devices"]):
        logged = dev["logged_mib"]
        if dev["kind"] == "rpc":
            assert logged["model"] == [round(dev["weights_bytes"] / MiB, 2)]
            assert logged["KV"] == [round(b / MiB, 2) for b in dev["kv_by_cache"]]
        # each device's compute is llama.cpp's dry run's: exact, except that under
        # pipeline parallelism it reserves 4 more copies of one n_embd x 512 f32
        # input on the later worker than the load takes (4 x 1.125 MiB for SmolLM2)
        assert dev["compute_source"] == "llama.cpp's dry run"
        extra = 4 * 576 * 512 * 4 / MiB if i == 1 else 0.0
        assert dev["compute_bytes"] / MiB == pytest.approx(logged["compute"][0] + extra, abs=0.006)


@pytest.mark.slow
def test_worker_dies_mid_generation(smollm2: Path) -> None:
    """The reply ends with one line and exit 1; chat saves the conversation."""
    w = WorkerProc()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localllm", "chat", "--rpc", str(w.ep), "--ctx", "2048", "-n", "-1", "--temp", "0", "--threads", "1", "--no-stats"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("Write a very long story about a lighthouse keeper, with many chapters.\n")
    proc.stdin.flush()
    first = proc.stdout.read(20)  # the reply has started
    assert first
    w.proc.kill()  # the worker dies mid-reply
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localllm: error: a worker stopped answering"), err
    assert "the chat is saved in" in lines[0]
    saved = Path(lines[0].rsplit("the chat is saved in ", 1)[1])
    data = json.loads(saved.read_text())
    assert data["messages"][0]["role"] == "user" and data["messages"][1]["content"].startswith(first)


@pytest.mark.slow
def test_worker_json_then_ctrl_c() -> None:
    """--json: one line on stdout when ready (llama.cpp's own chatter goes to
    stderr); Ctrl+C stops it at once with 130 and no traceback."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localllm", "worker", "--port", str(port), "--threads", "1", "--json"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["endpoint"] == f"127.0.0.1:{port}" and ready["devices"][0]["name"] == "CPU" and ready["devices"][0]["free_bytes"] > 0
        assert probe(Endpoint("127.0.0.1", port)).devices[0].name == f"RPC0[127.0.0.1:{port}]"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err and "worker stopped" in err
    assert out == ""


def test_fit_across_keeps_every_device_within_its_memory(smollm2: Path) -> None:
    """Two small workers: the policies give up context or layers until each
    device's total fits its free memory less the head-room."""
    from localllm.plan.placement import fit_across
    from localllm.plan.planner import default_margin

    shape = ModelShape.from_header(read_header(smollm2))
    small = [Device("RPC0[a:1]", "rpc", 300 * MiB), Device("RPC0[b:1]", "rpc", 300 * MiB)]
    cpu = Device("CPU", "cpu", 8 * 1024 * MiB)
    want = LoadConfig(n_ctx=8192, n_outputs_max=1)  # generation: one row of logits, as the CLI loads
    r, p = fit_across(shape, want, small, cpu, ram=8 * 1024 * MiB, policy="ctx")
    assert r.fits and p.plan.n_gpu_layers == 31
    assert (r.config.n_ctx, r.config.type_k) != (8192, "f16")  # something gave way
    for u in p.uses[:-1]:
        assert u.total_bytes <= u.device.free_bytes - default_margin(u.device.free_bytes)
    o, po = fit_across(shape, want, small, cpu, ram=8 * 1024 * MiB, policy="offload", kv_fixed=True)
    assert o.fits and o.config.n_ctx == 8192 and o.config.n_gpu_layers < 31
    assert sum(len(u.layers) for u in po.uses[:-1]) < 30 and po.uses[-1].layers
    big = [Device("RPC0[a:1]", "rpc", 8 * 1024 * MiB)]
    b, pb = fit_across(shape, want, big, cpu, ram=8 * 1024 * MiB)
    assert b.fits and b.reason == "fits as asked" and [len(u.layers) for u in pb.uses] == [30, 0]
    none, _ = fit_across(shape, want, small, cpu, ram=10 * MiB)
    assert not none.fits and "100.22 MiB of RAM at the smallest settings, 10.00 MiB available" in none.reason
