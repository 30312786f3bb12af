"""A mixture of experts that does not fit the GPU: its experts move to RAM layer
by layer before whole layers do (as llama.cpp's --fit), the policy still decides
between context and offload, and what the user fixed stays."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, planner
from localllm.plan.moe import offload_steps
from localllm.plan.placement import Device, fit_across, place
from localllm.plan.planner import ModelShape
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf

N = 4
WANT = LoadConfig(n_ctx=1024)


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> ModelShape:
    path = write_gguf(tmp_path_factory.mktemp("moe") / "qwen2moe.gguf", replace(CASES["qwen2moe"], n_layer=N, n_ctx_train=8192))
    return ModelShape.from_header(read_header(path))


def gpu_bytes(shape: ModelShape, cfg: LoadConfig) -> int:
    return planner.plan_memory(shape, cfg, gpu=True).total_gpu_bytes


def fit(shape: ModelShape, budget: int, want: LoadConfig = WANT, **kw) -> planner.FitResult:
    """The one fit on one local GPU that leaves exactly ``budget`` usable (its
    free memory less the 128 MiB head-room a small GPU keeps)."""
    kw.setdefault("kv_fixed", True)
    gpu = Device("GPU", "gpu", budget + planner.default_margin(0))
    return fit_across(shape, want, [gpu], Device("CPU", "cpu", None), ram=None, ctx_limit=want.n_ctx, **kw)[0]


@pytest.mark.parametrize("policy", ["ctx", "offload"])
def test_experts_move_layer_by_layer_first(shape: ModelShape, policy: str) -> None:
    """A budget that holds everything but the experts of k layers: exactly k
    layers' experts move (k-1 would not fit), every layer stays offloaded."""
    for k in range(1, N + 1):
        r = fit(shape, gpu_bytes(shape, replace(WANT, n_cpu_moe=k)), policy=policy)
        assert r.fits and r.config.n_gpu_layers == N + 1 and r.config.n_ctx == WANT.n_ctx, (k, r.reason)
        assert r.config.n_cpu_moe == (k if k < N else -1), (k, r.config)
        assert "experts of" in r.reason and "as in llama.cpp's --fit" in r.reason


def test_then_whole_layers_with_their_experts_in_ram(shape: ModelShape) -> None:
    budget = gpu_bytes(shape, replace(WANT, n_gpu_layers=3, n_cpu_moe=-1))
    r = fit(shape, budget, policy="offload")
    assert (r.config.n_gpu_layers, r.config.n_cpu_moe) == (3, -1), r.reason
    assert "2 of 4 layers + output on the GPU" in r.reason


def test_the_policy_still_chooses_context_or_offload(shape: ModelShape) -> None:
    """Experts move first under either policy, at the context asked; once they
    are all in RAM, --policy ctx gives up context and --policy offload whole layers."""
    want = replace(WANT, n_ctx=4096)
    experts_first = fit(shape, gpu_bytes(shape, replace(want, n_cpu_moe=2)), want, policy="ctx")
    assert (experts_first.config.n_ctx, experts_first.config.n_cpu_moe) == (4096, 2), experts_first.reason
    budget = gpu_bytes(shape, replace(want, n_ctx=2048, n_cpu_moe=-1))
    by_ctx = fit(shape, budget, want, policy="ctx")
    assert (by_ctx.config.n_ctx, by_ctx.config.n_cpu_moe, by_ctx.config.n_gpu_layers) == (2048, -1, N + 1), by_ctx.reason
    by_offload = fit(shape, budget, want, policy="offload")
    assert (by_offload.config.n_ctx, by_offload.config.n_cpu_moe) == (4096, -1) and by_offload.config.n_gpu_layers < N + 1, by_offload.reason


def test_what_the_user_fixed_stays(shape: ModelShape) -> None:
    budget = gpu_bytes(shape, replace(WANT, n_cpu_moe=2))
    r = fit(shape, budget, policy="offload", moe_fixed=True)  # --n-cpu-moe 0 given: whole layers move instead
    assert r.config.n_cpu_moe == 0 and r.config.n_gpu_layers < N + 1, r.reason
    r = fit(shape, budget, replace(WANT, n_gpu_layers=N + 1), policy="offload", ngl_fixed=True)  # --ngl given: experts move
    assert (r.config.n_gpu_layers, r.config.n_cpu_moe) == (N + 1, 2), r.reason


def test_a_dense_model_moves_whole_layers(synth_model: Path) -> None:
    dense = ModelShape.from_header(read_header(synth_model))
    experts, steps = offload_steps(dense.n_layer, dense.layer_expert_bytes is not None, WANT, gpu=True, ngl_fixed=False, moe_fixed=False)
    assert experts == [] and steps == [(n, 0) for n in range(dense.n_layer + 1, -1, -1)]


def test_the_fitting_service_says_so(shape: ModelShape) -> None:
    budget = fitting.Budget(gpu_bytes(shape, replace(WANT, n_cpu_moe=2)) + planner.default_margin(0), None)
    f = fitting.fit(shape, fitting.LoadOptions(n_ctx=1024, type_k="f16", type_v="f16", policy="offload").request(), budget)
    assert f.outcome is fitting.Outcome.PARTIAL_OFFLOAD and f.config.n_cpu_moe == 2 and f.full_gpu
    assert f.sentence.startswith("the experts of 2 of 4 layers in RAM")
    fixed = fitting.LoadOptions(n_ctx=1024, type_k="f16", type_v="f16", policy="offload", n_cpu_moe=0).request()
    assert fitting.fit(shape, fixed, budget).config.n_cpu_moe == 0


def test_across_devices_too(shape: ModelShape) -> None:
    """--rpc: a worker short of memory gets the layers' attention, the experts of
    the first layers stay in RAM (the same search over placement.fit_across)."""
    cpu = Device("CPU", "cpu", None)
    probe = place(shape, replace(WANT, n_gpu_layers=N + 1, n_cpu_moe=2), [Device("RPC0[x]", "rpc", None)], cpu, [1.0])
    free = probe.uses[0].total_bytes + planner.default_margin(0)
    r, pl = fit_across(shape, WANT, [Device("RPC0[x]", "rpc", free)], cpu, ram=None, policy="offload", kv_fixed=True, ctx_limit=WANT.n_ctx)
    assert (r.config.n_gpu_layers, r.config.n_cpu_moe) == (N + 1, 2) and r.fits, r.reason
    assert pl.uses[0].weights_bytes == probe.uses[0].weights_bytes and any("experts in RAM" in x for x in pl.rules)
