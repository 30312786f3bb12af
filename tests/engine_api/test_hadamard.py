"""The one Hadamard rule (llama-kv-cache.cpp attn_rot_k / attn_rot_v and
build_input_k_rot / build_input_v_rot), worked out by hand from the source:
K's matrix side is the largest power of two from 64 up dividing the cache's
shared head size, V's is always 64; none for f16, for a head size that is not a
multiple of 64, or for a cache whose layers differ in head size."""

from __future__ import annotations

import pytest

from localllm.engine_api.llama_rules import hadamard_sides
from localllm.plan import compute_graph, planner


@pytest.mark.parametrize(("k_all", "v_all", "head", "types", "want"), [
    (64, 64, 64, ("q8_0", "q8_0"), (64, 64)),
    (128, 128, 128, ("q8_0", "q8_0"), (128, 64)),  # V stays 64 x 64 (the source comments out V's loop)
    (256, 256, 256, ("q4_0", "f16"), (256, 0)),
    (192, 192, 192, ("q8_0", "q4_0"), (64, 64)),  # 192 = 64 x 3: 128 does not divide it
    (80, 80, 80, ("q8_0", "q8_0"), (0, 0)),  # not a multiple of 64
    (-1, -1, 128, ("q8_0", "q8_0"), (0, 0)),  # layers of the cache differ in head size
    (128, 128, 128, ("f16", "f16"), (0, 0)),
    (128, 0, 128, ("q8_0", "q8_0"), (128, 0)),  # MLA: no V
])
def test_hadamard_sides(k_all: int, v_all: int, head: int, types: tuple[str, str], want: tuple[int, int]) -> None:
    assert hadamard_sides(k_all, v_all, head, head, *types) == want


def test_the_replay_and_the_estimate_use_the_same_matrices(synth_case) -> None:
    """Head size 128, q8_0 cache: the replay's graph inputs and the estimate's
    bytes are both 128 x 128 for K and 64 x 64 for V."""
    from localllm.modelfile.gguf_file import read_header

    path = synth_case("qwen3")
    shape = planner.ModelShape.from_header(read_header(path))
    assert shape.head_dim_k == 128
    cfg = planner.LoadConfig(n_ctx=512, type_k="q8_0", type_v="q8_0")
    p = compute_graph.params(shape, cells=512, swa_cells=0, type_k="q8_0", type_v="q8_0", flash_attn=True)
    assert (p["caches"]["base"]["k_rot"], p["caches"]["base"]["v_rot"]) == (128, True)
    assert planner.hadamard_bytes(shape, cfg) == (128 * 128 + 64 * 64) * 4
