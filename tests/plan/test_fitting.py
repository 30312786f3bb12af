"""The fitting service (localllm/fitting.py) on a real model's header
(SmolLM2 135M, 30 layers + output): each outcome, the settings the user fixed
kept, and every chosen config within the budget by the planner's own plan."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting
from localllm.plan.fitting import Budget, Outcome, Request
from localllm.plan.placement import Device
from localllm.plan.planner import ModelShape, default_margin

MiB = 1 << 20
RAM = 8 * 1024 * MiB
ASK = LoadConfig(n_ctx=8192)


def _fit(smollm2: Path, request: Request, budget: Budget, **kw) -> fitting.Fit:
    return fitting.fit_header(read_header(smollm2), request, budget, **kw)


def _within(f: fitting.Fit) -> bool:
    p = f.plan
    gpu_ok = f.gpu_budget is None or p.total_gpu_bytes <= f.gpu_budget - default_margin(f.gpu_budget)
    return gpu_ok and (f.ram is None or p.total_cpu_bytes <= f.ram)


def test_fits_as_asked(smollm2: Path) -> None:
    f = _fit(smollm2, Request(ASK), Budget(None, RAM))
    assert f.outcome is Outcome.FITS_AS_ASKED and f.config == ASK and f.full_gpu and _within(f)
    assert f.trained_ctx == 8192 and f.n_layers == 31


def test_reduced_cache_type_or_context(smollm2: Path) -> None:
    kv = _fit(smollm2, Request(ASK), Budget(300 * MiB, RAM))  # cache types free: a cheaper cache first
    assert kv.outcome is Outcome.FITS_REDUCED and kv.config.type_k != "f16" and kv.config.n_ctx == 8192
    ctx = _fit(smollm2, Request(ASK, kv_fixed=True), Budget(300 * MiB, RAM))  # types fixed: the context gives way
    assert ctx.outcome is Outcome.FITS_REDUCED and ctx.config.type_k == "f16" and 2048 <= ctx.config.n_ctx < 8192
    assert ctx.gpu_layers == 31 and ctx.full_gpu and _within(kv) and _within(ctx)
    assert ctx.sentence == f"context {ctx.config.n_ctx} instead of 8192" and ctx.changes == (ctx.sentence,)


def test_partial_offload_keeps_the_context(smollm2: Path) -> None:
    f = _fit(smollm2, Request(ASK, kv_fixed=True, policy="offload"), Budget(300 * MiB, RAM))
    assert f.outcome is Outcome.PARTIAL_OFFLOAD and f.config.n_ctx == 8192 and 0 < f.gpu_layers < 31
    assert f.fits and not f.full_gpu and _within(f)


def test_fixed_layers_are_kept(smollm2: Path) -> None:
    asked = replace(ASK, n_gpu_layers=31)
    f = _fit(smollm2, Request(asked, kv_fixed=True, ngl_fixed=True, policy="offload"), Budget(300 * MiB, RAM))
    assert f.outcome is Outcome.FITS_REDUCED and f.config.n_gpu_layers == 31 and f.config.n_ctx < 8192


def test_cpu_only_and_does_not_fit(smollm2: Path) -> None:
    cpu = _fit(smollm2, Request(ASK), Budget(100 * MiB, RAM))
    assert cpu.outcome is Outcome.CPU_ONLY and cpu.config.n_gpu_layers == 0 and cpu.gpu_layers == 0
    assert "too small for even one layer" in cpu.sentence
    no = _fit(smollm2, Request(ASK), Budget(None, 1 * MiB))
    assert no.outcome is Outcome.DOES_NOT_FIT and not no.fits and not no.full_gpu and no.config == ASK
    d = no.to_dict()
    assert d["outcome"] == "does_not_fit" and json.loads(json.dumps(d))["asked"]["n_ctx"] == 8192


def test_offload_devices_go_through_the_same_service(smollm2: Path) -> None:
    """With --rpc the layers are placed across devices; the outcome and the
    split come back the same way."""
    small = [Device("RPC0[a:1]", "rpc", 300 * MiB), Device("RPC0[b:1]", "rpc", 300 * MiB)]
    cpu = Device("CPU", "cpu", RAM)
    header = read_header(smollm2)
    f = fitting.fit_header(header, Request(ASK, kv_fixed=True, policy="offload"), Budget(None, RAM), devices=small, cpu=cpu)
    assert f.outcome is Outcome.PARTIAL_OFFLOAD and f.config.n_ctx == 8192 and f.placement is not None
    assert f.config.tensor_split == f.placement.split and len(f.config.tensor_split) == 2
    big = fitting.fit(ModelShape.from_header(header), Request(ASK), Budget(None, RAM),
                      devices=[Device("RPC0[a:1]", "rpc", 8 * 1024 * MiB)], cpu=cpu, header=header)
    assert big.outcome is Outcome.FITS_AS_ASKED and big.full_gpu


@pytest.mark.parametrize("vram, outcome", [("4GiB", "fits_as_asked"), ("300MiB", "fits_reduced"), ("100MiB", "cpu_only")])
def test_plan_json_names_the_outcome(smollm2: Path, capsys, vram: str, outcome: str) -> None:
    from localllm.cli import main

    assert main(["plan", str(smollm2), "--ctx", "8192", "--vram", vram, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["outcome"] == outcome and d["fits"] is True
