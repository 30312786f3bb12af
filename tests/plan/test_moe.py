"""Experts in RAM (--cpu-moe / --n-cpu-moe), planned without llama.cpp: which
tensors the override patterns take, where their bytes go, and the refusals."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.engine_api.errors import InvalidSetting
from localllm.engine_api.llama_rules import cpu_moe_patterns
from localllm.modelfile.gguf_file import read_header
from localllm.plan import planner
from localllm.plan.placement import Device, pipeline_parallel, place
from localllm.plan.planner import ModelShape
from scripts.llama_tools import require_source
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf
from tests.helpers.cli import cli


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three-layer MoE models: a shared expert (qwen2moe), biases on the router
    and every expert (gpt-oss), neither (olmoe)."""
    d = tmp_path_factory.mktemp("moe")
    return {c: write_gguf(d / f"{c}.gguf", replace(CASES[c], n_layer=3)) for c in ("qwen2moe", "gpt-oss", "olmoe")}


def test_patterns_are_llama_cpps() -> None:
    """The regex is common/common.h's, as llama.cpp's --cpu-moe passes it; --n-cpu-moe N one per layer."""
    # the vendored source is installed by scripts/install.sh --test: absent, this fails (MissingTool names the fix)
    assert 'LLM_FFN_EXPS_REGEX = "\\\\.ffn_(up|down|gate|gate_up)_(ch|)exps"' in require_source("common/common.h").read_text()
    assert cpu_moe_patterns(-1) == [r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    assert cpu_moe_patterns(0) == []
    assert cpu_moe_patterns(2) == [r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    names = ["blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.bias", "blk.1.ffn_gate_up_exps.weight", "blk.11.ffn_up_exps.weight",
             "blk.1.ffn_gate_inp.weight", "blk.1.ffn_up_shexp.weight", "blk.1.attn_q.weight", "blk.21.ffn_gate_exps.weight"]
    taken = [n for n in names if any(re.search(p, n) for p in cpu_moe_patterns(2))]
    assert taken == ["blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.bias", "blk.1.ffn_gate_up_exps.weight"]


def test_expert_bytes_are_the_experts_with_their_biases(moe_files: dict[str, Path]) -> None:
    """Per layer: the *_exps tensors (biases too); never the router or a shared expert."""
    for case, path in moe_files.items():
        header = read_header(path)
        shape = ModelShape.from_header(header)
        for il in range(3):
            want = sum(t.n_bytes for t in header.tensors if t.name.startswith(f"blk.{il}.") and "_exps." in t.name)
            assert shape.layer_expert_bytes is not None and shape.layer_expert_bytes[il] == want, case
        if case == "gpt-oss":
            assert any(t.name == "blk.0.ffn_up_exps.bias" for t in header.tensors)
        if case == "qwen2moe":
            shexp = sum(t.n_bytes for t in header.tensors if t.name.startswith("blk.0.") and "shexp" in t.name)
            assert shexp and shape.layer_bytes[0] - shape.layer_expert_bytes[0] > shexp  # the shared expert stays with the layer


def test_plan_moves_the_experts_to_ram(moe_files: dict[str, Path]) -> None:
    shape = ModelShape.from_header(read_header(moe_files["qwen2moe"]))
    assert shape.layer_expert_bytes is not None
    base = LoadConfig(n_ctx=1024, n_gpu_layers=-1)
    full = planner.plan_memory(shape, base, gpu=True)
    for n, layers in ((-1, [0, 1, 2]), (1, [0]), (2, [0, 1])):
        p = planner.plan_memory(shape, replace(base, n_cpu_moe=n), gpu=True)
        moved = sum(shape.layer_expert_bytes[i] for i in layers)
        assert (p.weights_gpu_bytes, p.weights_cpu_bytes) == (full.weights_gpu_bytes - moved, full.weights_cpu_bytes + moved)
        assert p.kv_gpu_bytes == full.kv_gpu_bytes  # the cache stays with attention, on the GPU
    # a layer the GPU does not hold keeps its experts on the CPU either way
    part = planner.plan_memory(shape, replace(base, n_gpu_layers=2, n_cpu_moe=-1), gpu=True)
    assert part.weights_gpu_bytes == shape.layer_bytes[2] - shape.layer_expert_bytes[2] + shape.output_bytes + shape.tied_bytes


def test_placement_and_pipeline_parallelism(moe_files: dict[str, Path]) -> None:
    """Per device: the worker loses exactly the experts; two workers lose pipeline
    parallelism (llama-context.cpp: !model.has_tensor_overrides())."""
    header = read_header(moe_files["gpt-oss"])
    shape = ModelShape.from_header(header)
    assert shape.layer_expert_bytes is not None
    cfg = LoadConfig(n_ctx=1024, n_gpu_layers=-1)
    devs, cpu = [Device("RPC0[a]", "rpc", None)], Device("CPU", "cpu", None)
    a, b = place(shape, cfg, devs, cpu, [1.0], header), place(shape, replace(cfg, n_cpu_moe=-1), devs, cpu, [1.0], header)
    moved = sum(shape.layer_expert_bytes)
    assert b.uses[0].weights_bytes == a.uses[0].weights_bytes - moved and b.uses[1].weights_bytes == a.uses[1].weights_bytes + moved
    assert b.uses[1].mapped_bytes is not None and a.uses[1].mapped_bytes is not None and b.uses[1].mapped_bytes > a.uses[1].mapped_bytes
    assert any("experts in RAM" in r for r in b.rules)
    assert pipeline_parallel(2, shape, cfg) and not pipeline_parallel(2, shape, replace(cfg, n_cpu_moe=1))


def test_refusals(moe_files: dict[str, Path], synth_model: Path) -> None:
    dense = ModelShape.from_header(read_header(synth_model))
    with pytest.raises(InvalidSetting, match="not a mixture of experts"):
        planner.check_moe(dense, LoadConfig(n_cpu_moe=-1))
    moe = ModelShape.from_header(read_header(moe_files["olmoe"]))
    with pytest.raises(InvalidSetting, match="at most the model's 3 layers, got 4"):
        planner.check_moe(moe, LoadConfig(n_cpu_moe=4))
    planner.check_moe(moe, LoadConfig(n_cpu_moe=3))
    assert moe.layer_expert_bytes is not None
    leading = replace(moe, layer_expert_bytes=[0, *moe.layer_expert_bytes[1:]])  # a leading dense layer, as DeepSeek's
    with pytest.raises(InvalidSetting, match="n_cpu_moe 1 matches no tensor: the first layer of this model has no experts"):
        planner.check_moe(leading, LoadConfig(n_cpu_moe=1))
    planner.check_moe(leading, LoadConfig(n_cpu_moe=2))


@pytest.mark.parametrize("args", [("--cpu-moe",), ("--n-cpu-moe", "1")])
def test_dense_model_is_one_line_exit_2(args: tuple[str, ...], synth_model: Path) -> None:
    r = cli("plan", str(synth_model), *args, "--no-dry-run")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--n-cpu-moe/--cpu-moe" in lines[0] and "not a mixture of experts" in lines[0], r.stderr


def test_count_past_the_layers_is_one_line_exit_2(moe_files: dict[str, Path]) -> None:
    r = cli("plan", str(moe_files["olmoe"]), "--n-cpu-moe", "4", "--no-dry-run")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "at most the model's 3 layers" in r.stderr, r.stderr
    r = cli("plan", str(moe_files["olmoe"]), "--n-cpu-moe", "-1")
    assert r.returncode == 2 and "--n-cpu-moe" in r.stderr
    r = cli("plan", str(moe_files["olmoe"]), "--cpu-moe", "--n-cpu-moe", "1")
    assert r.returncode == 2 and "not allowed with" in r.stderr


def test_experts_in_ram_are_refereed_by_the_dry_run(tmp_path: Path) -> None:
    """qwen3moe's graph is replayed whole, but experts in RAM split it between
    the CPU and the GPU: the compute figure is then an estimate, which llama.cpp's
    dry run referees (plan.prepare), not the replay."""
    path = write_gguf(tmp_path / "qwen3moe.gguf", replace(CASES["qwen3moe"], n_layer=3))
    shape = ModelShape.from_header(read_header(path))
    assert not planner.plan_memory(shape, LoadConfig(n_ctx=1024), gpu=True).compute_estimated
    assert planner.plan_memory(shape, LoadConfig(n_ctx=1024, n_cpu_moe=1), gpu=True).compute_estimated
