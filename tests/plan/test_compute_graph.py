"""The allocator replay (localllm/compute_graph.py) on hand-worked cases from
ggml/src/ggml-alloc.c; its figures against llama.cpp's own log are checked in
tests/plan/test_conformance.py (compute within 5% on every case)."""

from __future__ import annotations

from localllm.plan.compute_graph import Graph, _DynAlloc, allocate, dup, mul_mat, new, weight


def test_best_fit_reuses_a_hole_and_grows_at_the_end() -> None:
    """ggml_dyn_tallocr: best fit among the free blocks but the last; a block freed
    next to the last one merges into it; sizes padded to 32 bytes."""
    a = _DynAlloc()
    assert [a.alloc(64), a.alloc(128), a.alloc(64)] == [0, 64, 192]
    a.free(0, 64)
    a.free(192, 64)  # merges with the unbounded tail block
    assert a.alloc(20) == 0  # padded to 32, into the 64-byte hole
    assert a.alloc(96) == 192  # the 32 bytes left in the hole are too small
    assert a.max_size == 288


def test_inplace_op_reuses_its_only_parent() -> None:
    """ggml_gallocr_allocate_node: an ADD whose parent has no other consumer takes the
    parent's memory; inputs are allocated first and freed after their last consumer."""
    g = Graph()
    x = new("f32", 8)  # 32 bytes, an input: allocated before any node
    a = mul_mat(weight(8, 16), x)  # 64 bytes at 32
    b = dup("ADD", a, weight(16, type_="f32"))  # in place of a
    c = mul_mat(weight(16, 16), b)  # x's 32 bytes are free, too small: 64 bytes at 96
    g.expand(c)
    assert allocate(g) == 160
    # a2 has two consumers, so add1 gets its own 64 bytes at 96 (add2 then reuses add1);
    # when a2 is freed the hole [0, 96) is too small for the 128-byte result: at 160.
    g2 = Graph()
    a2 = mul_mat(weight(8, 16), new("f32", 8))
    both = dup("ADD", dup("ADD", a2, weight(16, type_="f32")), a2)
    g2.expand(mul_mat(weight(16, 32), both))
    assert allocate(g2) == 160 + 128
