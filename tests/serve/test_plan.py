"""serve's memory plan is the batch engine's load: one unified KV cache for
--parallel sequences (its sliding window n_swa x n_seq + n_ubatch cells,
src/llama-kv-cache-iswa.cpp) and one row of logits per sequence. The planner's
figures are compared with what llama.cpp allocates when BatchModel loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_serve_plan_matches_what_llama_cpp_allocates(model: str, request: pytest.FixtureRequest) -> None:
    from localllm.engine.batch import BatchModel
    from localllm.engine.llamalog import ROUTER
    from localllm.plan import memcheck

    path: Path = request.getfixturevalue(model)
    n_seq = 4
    cfg = LoadConfig(n_ctx=512 * n_seq, n_seq=n_seq, n_outputs_max=n_seq, kv_unified=True, n_threads=1)
    m = BatchModel()
    mark = ROUTER.mark()
    try:
        m.load(path, cfg, n_seq)
        lines = ROUTER.lines_since(mark)
    finally:
        m.close()
    mc = memcheck.check_load(path, cfg, lines)
    assert mc.ok, mc.report_lines()
    kv = [c for c in mc.buffers if c.buffer in ("kv", "kv_swa")]
    assert kv and all(c.llama_bytes is not None for c in kv), mc.report_lines()
    out = next(c for c in mc.buffers if c.buffer == "output")
    assert out.llama_bytes is not None and out.ok, mc.report_lines()


def test_a_unified_pool_sizes_the_window_for_every_sequence(gemma: Path) -> None:
    """Pure planner, on Gemma 3's header (512-token window): a unified pool of 4
    sequences keeps 4 x 512 + 512 window cells, 4 separate streams keep
    512 + 512 each (src/llama-kv-cache-iswa.cpp), padded to 256."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan.planner import ModelShape, kv_cells

    shape = ModelShape.from_header(read_header(gemma))
    assert shape.n_swa == 512
    unified = LoadConfig(n_ctx=16384, n_seq=4, kv_unified=True, n_ubatch=512)
    streams = LoadConfig(n_ctx=16384, n_seq=4, kv_unified=False, n_ubatch=512)
    assert kv_cells(shape, unified) == (16384, 4 * 512 + 512)
    assert kv_cells(shape, streams) == (4096, 512 + 512)
