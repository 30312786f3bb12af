"""pull --vram with a mixture of experts: a quant that fits the GPU whole wins;
when none does, the largest whose experts fit in RAM, and never one whose RAM
does not hold them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header
from localllm.plan import planner, verdict
from localllm.store.hub import RemoteFile, pick_by_budget
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, planner.ModelShape]:
    d = tmp_path_factory.mktemp("moe")
    spec = replace(CASES["olmoe"], n_layer=3, n_ctx_train=2048)
    return {q: planner.ModelShape.from_header(read_header(write_gguf(d / f"Moe-{q}.gguf", replace(spec, dtype=q.lower()))))
            for q in ("F32", "F16")}


FILES = [RemoteFile("Moe-F32.gguf", 2, "F32"), RemoteFile("Moe-F16.gguf", 1, "F16")]


def pick(shapes: dict[str, planner.ModelShape], budget: int, ram: int | None = None) -> tuple[RemoteFile, str]:
    return pick_by_budget(FILES, lambda f: verdict.judge(shapes[f.quant or ""], 2048, budget, ram), budget)


def whole(shape: planner.ModelShape) -> int:
    """The GPU budget that holds the model whole (with the head-room kept)."""
    return planner.default_margin(1) + verdict.judge(shape, 2048, 1 << 40, None).gpu_bytes + (1 << 20)


def test_whole_on_the_gpu_wins_over_a_larger_quant_with_experts_in_ram(shapes: dict[str, planner.ModelShape]) -> None:
    budget = whole(shapes["F16"])
    assert verdict.judge(shapes["F32"], 2048, budget, None).n_cpu_moe != 0  # F32 would need experts in RAM
    f, why = pick(shapes, budget)
    assert f.quant == "F16" and "with every layer on the GPU" in why


def test_experts_in_ram_when_nothing_fits_whole(shapes: dict[str, planner.ModelShape]) -> None:
    budget = whole(shapes["F16"]) - (1 << 21)
    v = verdict.judge(shapes["F32"], 2048, budget, None)
    assert v.full_gpu and v.n_cpu_moe != 0 and v.text.startswith("yes, experts in RAM (")
    f, why = pick(shapes, budget)
    assert f.quant == "F32" and "the experts in RAM, as none fits the GPU whole" in why
    # RAM that holds the F16 quant's experts but not the F32's: the F16
    ram = verdict.judge(shapes["F16"], 2048, budget, None).ram_bytes + (1 << 20)
    assert pick(shapes, budget, ram)[0].quant == "F16"
    with pytest.raises(InputError, match="no quant of this model fits"):
        pick(shapes, budget, ram=1 << 20)
