"""The decode rate plan predicts: the bytes a token reads split between RAM
(a MoE's routed experts kept there) and GPU memory, each at its bandwidth."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.measure.predict import predict
from localllm.modelfile.gguf_file import read_header
from localllm.plan import planner
from localllm.plan.planner import ModelShape
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf
from tests.helpers.cli import cli

GB = 1e9


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("moe") / "olmoe.gguf", replace(CASES["olmoe"], n_layer=3))


def test_routed_experts_in_ram_at_ram_speed(moe: Path) -> None:
    header = read_header(moe)
    shape = ModelShape.from_header(header)
    used, n_exp = shape.n_expert_used, shape.n_expert
    assert (used, n_exp) == (2, 8)
    tied = not any(t.name == "output.weight" for t in header.tensors)  # then token_embd is the output matrix too
    exps = sum(t.n_bytes for t in header.tensors if "_exps." in t.name)
    embd = next(t.n_bytes for t in header.tensors if t.name == "token_embd.weight")
    rest = sum(t.n_bytes for t in header.tensors if t.name != "token_embd.weight") - exps
    read = rest + (embd if tied else 0) + exps * used // n_exp  # the embedding is a one-row lookup; a token reads 2 of 8 experts
    for n, layers in ((-1, 3), (1, 1)):
        plan = planner.plan_memory(shape, LoadConfig(n_ctx=512, n_cpu_moe=n), gpu=True)
        p = predict(shape, plan, gpu=True, gpu_bandwidth=400 * GB, threads=1, ram_bandwidth=20 * GB)
        in_ram = sum(t.n_bytes for t in header.tensors if "_exps." in t.name and int(t.name.split(".")[1]) < layers) * used // n_exp
        assert abs(p.ram_bytes_per_token - in_ram) <= 3 * layers and p.ram_bytes_per_token + p.gpu_bytes_per_token == read
        assert p.ceiling_tokens_per_s == pytest.approx(1 / (p.ram_bytes_per_token / (20 * GB) + p.gpu_bytes_per_token / (400 * GB)))
        assert p.ram_bound_tokens_per_s == pytest.approx(20 * GB / p.ram_bytes_per_token)
    unknown = predict(shape, plan, gpu=True, gpu_bandwidth=None, threads=1, ram_bandwidth=20 * GB)
    assert unknown.ceiling_tokens_per_s is None and unknown.ram_bound_tokens_per_s is not None
    assert "n/a (the GPU's bandwidth is unknown); the RAM part alone caps it at" in unknown.line()
    cpu = predict(shape, planner.plan_memory(shape, LoadConfig(n_ctx=512), gpu=False), gpu=False, gpu_bandwidth=None, threads=1,
                  ram_bandwidth=20 * GB)
    assert cpu.gpu_bytes_per_token == 0 and cpu.ram_bytes_per_token == read and "at most" in cpu.line()


@pytest.mark.slow
def test_plan_shows_it(moe: Path) -> None:
    r = cli("plan", str(moe), "--cpu-moe", "--vram", "4GiB", "--no-dry-run", "--json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["predicted_decode"]
    assert p["ram_bytes_per_token"] > 0 and p["gpu_bytes_per_token"] > 0 and p["ram_bandwidth_bytes_per_s"] > 0
    assert p["ram_bound_tokens_per_s"] == pytest.approx(p["ram_bandwidth_bytes_per_s"] / p["ram_bytes_per_token"])
    text = cli("plan", str(moe), "--no-dry-run", "--threads", "1").stdout
    assert "predicted decode: at most" in text
