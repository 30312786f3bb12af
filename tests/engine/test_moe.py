"""Experts in RAM against llama.cpp: a loopback RPC worker stands in for the GPU,
and each device's weights, KV and compute are what llama.cpp allocates there."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan.placement import Device, place
from localllm.plan.planner import MiB, ModelShape
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf
from tests.helpers.cli import cli
from tests.helpers.workers import WorkerProc

N_LAYER = 3


@pytest.fixture(scope="module")
def worker():
    w = WorkerProc()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A shared expert (qwen2moe), biases on the router and every expert (gpt-oss), neither (olmoe)."""
    d = tmp_path_factory.mktemp("moe")
    return {c: write_gguf(d / f"{c}.gguf", replace(CASES[c], n_layer=N_LAYER)) for c in ("qwen2moe", "gpt-oss", "olmoe")}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qwen2moe", "gpt-oss", "olmoe"])
def test_each_device_holds_what_the_plan_says(case: str, worker, moe_files: dict[str, Path]) -> None:
    """--cpu-moe and --n-cpu-moe 1 and N-1, every layer offloaded to the worker:
    the worker's model and KV buffers and the CPU's mapped weights equal the
    placement's to the printed 0.01 MiB; llama.cpp's dry run gives each device's
    compute buffer as the load allocates it (the plan's compute figure under
    these overrides)."""
    from localllm.engine import LlamaCppBackend, dryrun

    path = moe_files[case]
    header = read_header(path)
    shape = ModelShape.from_header(header)
    ep = str(worker.ep)
    rpc = Device(f"RPC0[{ep}]", "rpc", None)
    base = LoadConfig(n_ctx=1024, n_gpu_layers=-1, flash_attn="on", n_threads=1, rpc_servers=(ep,), tensor_split=(1.0,))
    wrong = []
    worker_weights = []
    for n in (-1, 1, N_LAYER - 1):
        cfg = replace(base, n_cpu_moe=n)
        pl = place(shape, cfg, [rpc], Device("CPU", "cpu", None), [1.0], header=header)
        dry = dryrun.run(path, cfg)
        with LlamaCppBackend() as b:
            b.load(path, cfg)
            logged = b.logged_buffers
            assert b.tokenize("hello")  # loaded and usable
        for u in pl.uses:
            got = logged.get(u.device.name, {})
            cpu = u.device.kind == "cpu"
            weights = round((u.mapped_bytes if cpu else u.weights_bytes) / MiB, 2)  # type: ignore[operator]
            if [weights] != got.get("model", [])[:1] or [round(x / MiB, 2) for x in u.kv_by_cache] != got.get("KV", []):
                wrong.append(f"n_cpu_moe {n} {u.device.name}: weights {weights} vs {got.get('model')}, KV {u.kv_by_cache} vs {got.get('KV')}")
            d = dry.total("compute", cpu=cpu)
            if d is None or round(d / MiB, 2) != got.get("compute", [None])[0]:
                wrong.append(f"n_cpu_moe {n} {u.device.name}: dry run compute {d} vs {got.get('compute')}")
        worker_weights.append(pl.uses[0].weights_bytes)
    assert not wrong, "\n".join(wrong)
    assert worker_weights[0] < worker_weights[2] < worker_weights[1]  # all experts < N-1 layers' < one layer's in RAM


@pytest.mark.slow
def test_plan_and_run_with_experts_in_ram(worker, moe_files: dict[str, Path]) -> None:
    """plan --rpc --n-cpu-moe shows per device llama.cpp's dry run's compute and
    says the experts stay in RAM; run decodes, and its devices agree with the log."""
    path = str(moe_files["qwen2moe"])
    ep = str(worker.ep)
    r = cli("plan", path, "--rpc", ep, "--n-cpu-moe", "2", "--ctx", "1024", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_cpu_moe"] == 2 and d["experts_ram_layers"] == 2
    assert all(x["compute_source"] == "llama.cpp's dry run" for x in d["devices"])
    r = cli("plan", path, "--rpc", ep, "--cpu-moe", "--ctx", "1024")
    assert r.returncode == 0 and "experts in RAM: those of 3 of 3 layers" in r.stdout, r.stdout + r.stderr
    r = cli("run", path, "--rpc", ep, "--cpu-moe", "--ctx", "1024", "--raw", "-p", "hello", "-n", "4", "--temp", "0", "--json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rpc = [x for x in out["devices"] if x["kind"] == "rpc"][0]
    assert rpc["logged_mib"]["model"] == [round(rpc["weights_bytes"] / MiB, 2)]
    assert out["generated_tokens"] >= 1


@pytest.mark.slow
def test_plan_and_run_choose_experts_in_ram_for_a_small_gpu(tmp_path: Path) -> None:
    """--vram short of the model by two layers' experts: plan (with llama.cpp's
    dry run) chooses the experts of 2 layers in RAM and says why; run loads that
    choice and llama.cpp's buffers agree with the plan (its memory check)."""
    spec = replace(CASES["qwen2moe"], n_layer=4, n_embd=256, n_expert=16, n_ff_exp=512, n_ff_shexp=512, dtype="f16", n_ctx_train=4096)
    path = write_gguf(tmp_path / "moe.gguf", spec)
    shape = ModelShape.from_header(read_header(path))
    from localllm.plan import planner

    want = LoadConfig(n_ctx=2048, n_cpu_moe=2)
    vram = planner.plan_memory(shape, want, gpu=True).total_gpu_bytes + 128 * MiB + MiB  # the head-room kept, and 1 MiB slack
    r = cli("plan", str(path), "--vram", f"{vram / MiB:.2f}MiB", "--ctx", "2048", "--policy", "offload", "--kv-type", "f16", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_cpu_moe"] == 2 and d["outcome"] == "partial_offload" and d["sources"]["compute"] == "llama.cpp's dry run"
    assert d["reason"].startswith("the experts of 2 of 4 layers in RAM") and "llama.cpp's --fit" in d["reason"]
    r = cli("run", str(path), "--vram", f"{vram / MiB:.2f}MiB", "--ctx", "2048", "--policy", "offload", "--kv-type", "f16", "--raw",
            "-p", "hello", "-n", "2", "--temp", "0", "--json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["memory_check"]["ok"] is True and out["plan"]["n_cpu_moe"] == 2, out["plan"]


@pytest.mark.slow
def test_serves_batch_engine_keeps_the_experts_in_ram_too(worker, moe_files: dict[str, Path]) -> None:
    """serve's batch engine loads through the same parameters: the worker's model
    buffer is the placement's, without the experts."""
    from localllm.engine.batch import BatchModel
    from localllm.engine.llamalog import ROUTER
    from localllm.plan.placement import logged_buffers

    path = moe_files["olmoe"]
    header = read_header(path)
    ep = str(worker.ep)
    cfg = LoadConfig(n_ctx=1024, n_gpu_layers=-1, flash_attn="on", n_threads=1, rpc_servers=(ep,), tensor_split=(1.0,), n_cpu_moe=-1,
                     n_seq=2, kv_unified=True, n_outputs_max=2)
    pl = place(ModelShape.from_header(header), cfg, [Device(f"RPC0[{ep}]", "rpc", None)], Device("CPU", "cpu", None), [1.0], header=header)
    mark = ROUTER.mark()
    m = BatchModel()
    try:
        m.load(path, cfg, 2)
    finally:
        m.close()
    logged = logged_buffers([line for _, line in ROUTER.lines_since(mark)])
    assert logged[f"RPC0[{ep}]"]["model"] == [round(pl.uses[0].weights_bytes / MiB, 2)]
