"""One code path for every set of devices: the CPU alone, one local GPU, RPC
workers. The fit goes through ``placement.fit_across`` for all of them; these
tests check that the per-device placement of a local GPU carries exactly the
budget figures the plan shows (so the one path did not change what one GPU is
told), and that a recurrent state goes to its layer's device."""

from __future__ import annotations

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, planner
from localllm.plan.placement import Device, place
from localllm.plan.planner import MiB, ModelShape


def _shape(synth_case, case: str) -> ModelShape:
    return ModelShape.from_header(read_header(synth_case(case)))


@pytest.mark.parametrize("case", ["llama", "granitehybrid", "gemma2", "qwen3moe"])
@pytest.mark.parametrize("ngl", [-1, 0, 1, 2])
def test_a_local_gpu_placement_is_the_plan(synth_case, case: str, ngl: int) -> None:
    shape = _shape(synth_case, case)
    cfg = LoadConfig(n_ctx=1024, n_gpu_layers=ngl)
    plan = planner.plan_memory(shape, cfg, gpu=True)
    gpu, cpu = place(shape, cfg, [Device("GPU", "gpu", 4096 * MiB)], Device("CPU", "cpu", None)).uses
    assert gpu.total_bytes == plan.total_gpu_bytes
    assert cpu.total_bytes == plan.total_cpu_bytes
    assert (gpu.compute_bytes, cpu.compute_bytes) == ((plan.compute_bytes, 0) if plan.compute_on_gpu else (0, plan.compute_bytes))


def test_the_cpu_alone_is_the_plan(synth_case) -> None:
    shape = _shape(synth_case, "granitehybrid")
    cfg = LoadConfig(n_ctx=1024)
    plan = planner.plan_memory(shape, cfg, gpu=False)
    (cpu,) = place(shape, cfg, [], Device("CPU", "cpu", None)).uses
    assert cpu.total_bytes == plan.total_cpu_bytes and plan.rs_bytes > 0


def test_recurrent_state_is_on_its_layers_device(synth_case) -> None:
    shape = _shape(synth_case, "granitehybrid")  # layers "mmam": recurrent 0, 1, 3; attention 2
    cfg = LoadConfig(n_ctx=1024, n_gpu_layers=-1)
    plan = planner.plan_memory(shape, cfg, gpu=True)
    uses = place(shape, cfg, [Device("RPC0[a]", "rpc", None), Device("RPC1[b]", "rpc", None)], Device("CPU", "cpu", None), [1.0, 1.0]).uses
    assert sum(u.kv_bytes for u in uses) == plan.kv_cache_bytes + plan.rs_bytes
    per_layer = plan.rs_bytes // len(shape.recurrent_layers)
    for u in uses:
        kv = sum(kl.k_bytes + kl.v_bytes for kl in plan.kv_layers if kl.layer in u.layers)
        assert u.kv_bytes == kv + per_layer * len(shape.recurrent_layers & set(u.layers))


def test_a_budget_too_small_for_anything_names_ram_not_a_zero_byte_gpu(synth_case) -> None:
    shape = _shape(synth_case, "llama")
    f = fitting.fit(shape, fitting.Request(LoadConfig(n_ctx=4096)), fitting.Budget(400 * 1024, 1 * MiB))
    assert not f.fits
    assert "of RAM at the smallest settings" in f.sentence and "needs 0 B" not in f.sentence
