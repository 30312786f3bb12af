"""M-RoPE vision models (Qwen2-VL, Qwen2.5-VL): an image of nx x ny cells takes
max(nx, ny) positions (libmtmd's ``mtmd_image_tokens_get_n_pos``), so the text
after it sits at a position other than its cell index (issue 49).

The referee is libmtmd itself: ``mtmd_helper_eval_chunks`` evaluates the same
prompt on a context of its own, and the text after it is decoded at the
position the helper returns. localllm's logits must equal its logits, for the
prompt, for a follow-up appended to the cache, after a truncation back to the
image, and after the cache went through a state file. A control shows that the
test can fail: the follow-up at the cell index (what llama.cpp does when the
position is left to it) gives other logits.

The pair is synthetic (scripts/make_vision_model.py ``--size qwen2vl``): a
qwen2vl text model (``rope.dimension_sections``) and a qwen2vl_merger projector
that makes 16 tokens on a 4 x 4 grid for a 32 px picture, in 4 positions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import mtmd_cpp as mtmd

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import InputError
from localllm.vision.image import RGBImage, decode_image
from localllm.vision.marker import MARKER
from localllm.vision.projector import check_pair, read_projector
from tests.vision.conftest import noise_png

ONE = SamplingConfig(temperature=0, max_tokens=1)  # the prompt's logits: nothing decoded after it
PROMPT = "what is this?"
N_BATCH = 256


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from scripts.make_vision_model import write_vision_model

    return write_vision_model(tmp_path_factory.mktemp("qwen2vl"), size="qwen2vl")


@pytest.fixture(scope="module")
def backend(pair: tuple[Path, Path]) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend()
    b.load(pair[0], LoadConfig(n_ctx=256, n_threads=1))
    b.load_projector(pair[1])
    yield b
    b.close()


def _picture(seed: int) -> RGBImage:
    return decode_image(noise_png(seed, (32, 32)), name=f"noise{seed}.png")


def referee(pair: tuple[Path, Path], image: RGBImage, more: list[int], *, at_cells: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """libmtmd's own evaluation of ``MARKER\\nPROMPT`` on a fresh context: the
    prompt's logits, the logits after ``more`` decoded at the next position
    (``at_cells``: at the cell count instead), and that next position."""
    model, proj = pair
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    m = llama_cpp.llama_model_load_from_file(str(model).encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, N_BATCH, N_BATCH, 1, 1
    ctx = llama_cpp.llama_init_from_model(m, cp)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 1, False
    mctx = mtmd.mtmd_init_from_file(str(proj).encode(), m, params)
    chunks = mtmd.mtmd_input_chunks_init()
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    try:
        assert mctx and mtmd.mtmd_decode_use_mrope(mctx)
        bm = mtmd.mtmd_bitmap_init(image.width, image.height, ctypes.cast(ctypes.c_char_p(image.rgb), ctypes.POINTER(ctypes.c_uint8)))
        raw = (MARKER + "\n" + PROMPT).encode()
        inp = mtmd.mtmd_input_text()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), True, False
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(inp), (mtmd.mtmd_bitmap_p_ctypes * 1)(bm), 1) == 0
        mtmd.mtmd_bitmap_free(bm)
        cells = sum(mtmd.mtmd_input_chunk_get_n_tokens(mtmd.mtmd_input_chunks_get(chunks, i)) for i in range(mtmd.mtmd_input_chunks_size(chunks)))
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past)) == 0
        first = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        at = cells if at_cells else n_past.value
        batch = llama_cpp.llama_batch_init(len(more), 0, 1)
        batch.n_tokens = len(more)
        for i, t in enumerate(more):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, at + i, 1, i == len(more) - 1
            batch.seq_id[i][0] = 0
        assert llama_cpp.llama_decode(ctx, batch) == 0
        llama_cpp.llama_batch_free(batch)
        second = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        return first, second, n_past.value
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(mctx)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(m)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.abs(a - b).max() <= 1e-4 * max(1.0, float(np.abs(b).max())))


def _ours(backend: LlamaCppBackend, image: RGBImage, more: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    with backend.stream_images(PROMPT, [image], ONE, chat=False) as gen:
        list(gen)
    first, cells = backend.last_logits(), backend.context_used
    with backend.extend(more, ONE, n_keep=0) as gen:
        list(gen)
    return first, backend.last_logits(), cells


def test_the_text_after_an_image_sits_where_libmtmd_puts_it(backend: LlamaCppBackend, pair: tuple[Path, Path]) -> None:
    picture = _picture(3)
    more = backend.tokenize(" and what colour is it?")
    ref_first, ref_second, next_pos = referee(pair, picture, more)
    first, second, cells = _ours(backend, picture, more)
    assert next_pos < cells  # 16 cells of the image in 4 positions: the text after it is not at its cell index
    assert _close(first, ref_first), np.abs(first - ref_first).max()
    assert _close(second, ref_second), np.abs(second - ref_second).max()
    # the control: at the cell index (llama.cpp's own choice without a position) the follow-up reads otherwise
    _, wrong, _ = referee(pair, picture, more, at_cells=True)
    assert not _close(wrong, ref_second)


def test_another_picture_moves_the_logits_and_the_same_one_is_not_encoded_again(backend: LlamaCppBackend) -> None:
    def logits(seed: int, encoded: int) -> np.ndarray:
        with backend.stream_images(PROMPT, [_picture(seed)], ONE, chat=False) as gen:
            list(gen)
        assert gen.stats is not None and gen.stats.images == encoded
        return backend.last_logits()

    a, b, a2 = logits(11, 1), logits(12, 1), logits(11, 0)
    assert np.array_equal(a, a2) and np.abs(a - b).max() > 1e-4


def test_a_truncation_back_to_the_image_and_a_state_file_keep_the_positions(backend: LlamaCppBackend, tmp_path: Path) -> None:
    picture = _picture(5)
    more = backend.tokenize(" tell me more")
    _, second, cells = _ours(backend, picture, more)
    backend.truncate(cells)  # back to the end of the prompt: the follow-up is decoded again at the same position
    with backend.extend(more, ONE, n_keep=0) as gen:
        list(gen)
    assert _close(backend.last_logits(), second)
    backend.truncate(cells)
    state = tmp_path / "qwen.state"
    backend.save_state(state)
    backend.reset()
    assert backend.load_state(state) and backend.context_used == cells
    with backend.extend(more, ONE, n_keep=0) as gen:
        list(gen)
    assert _close(backend.last_logits(), second)


def test_a_projector_of_another_family_is_one_line_naming_both(pair: tuple[Path, Path], vision_model: tuple[Path, Path]) -> None:
    """A Qwen2-VL projector on a llama text model and a Gemma 3 projector on a
    qwen2vl text model: the widths match (64), the families do not."""
    from localllm.modelfile.gguf_file import read_header

    for model, proj in ((vision_model[0], pair[1]), (pair[0], vision_model[1])):
        with pytest.raises(InputError) as err:
            check_pair(read_header(model), read_projector(proj))
        msg = str(err.value)
        assert proj.name in msg and model.name in msg and "\n" not in msg, msg
    check_pair(read_header(pair[0]), read_projector(pair[1]))  # its own family: taken


def test_plan_says_an_m_rope_cache_re_reads_instead_of_shifting(pair: tuple[Path, Path]) -> None:
    """llama.cpp cannot shift an M-RoPE cache (llama-kv-cache.cpp get_can_shift): plan says so, in text and in --json."""
    import json

    from tests.helpers.cli import cli

    text = cli("plan", str(pair[0]), "--no-mmproj")
    assert text.returncode == 0, text.stderr
    assert "context shift: re-reads the kept window (llama.cpp cannot shift an M-RoPE cache)" in text.stdout
    assert json.loads(cli("plan", str(pair[0]), "--no-mmproj", "--json").stdout)["context_shift"] == "reprocess"


def test_a_full_context_that_holds_an_image_stops_with_one_line(pair: tuple[Path, Path]) -> None:
    """The cache cannot shift and its pictures are no tokens to read again: a reply
    stops at the full context, and a next turn is one line (ContextFull), where a
    text-only chat re-reads its kept window."""
    from localllm.engine_api.errors import ContextFull

    b = LlamaCppBackend()
    long = SamplingConfig(temperature=0, max_tokens=400, ignore_eos=True)
    try:
        b.load(pair[0], LoadConfig(n_ctx=256, n_threads=1))
        b.load_projector(pair[1])
        with b.stream_images(PROMPT, [_picture(7)], long, chat=False) as gen:
            list(gen)
        assert gen.stats is not None and gen.stats.stop_reason == "context" and b.context_used == 256
        b.truncate(200)
        with pytest.raises(ContextFull) as err:
            with b.extend(b.tokenize(" go on", add_special=False), long, n_keep=0) as gen:
                list(gen)
        assert "cannot shift a cache that holds images" in str(err.value) and "\n" not in str(err.value)
        b.reset()
        with b.stream(b.tokenize(PROMPT), long) as gen:  # text only: the kept window is read again
            assert len(list(gen)) == 400
        assert gen.stats is not None and gen.stats.context_shifts and all(s.method == "reprocess" for s in gen.stats.context_shifts)
    finally:
        b.close()


def test_a_state_file_with_image_spans_that_do_not_fit_is_refused(backend: LlamaCppBackend, tmp_path: Path) -> None:
    """The spans come from a file (outside input): each bad shape is refused by name and leaves an empty cache."""
    from localllm.engine.statefile import pack_state, unpack_state

    _ours(backend, _picture(9), backend.tokenize(" more"))
    good = tmp_path / "good.state"
    backend.save_state(good)
    meta, tokens, payload = unpack_state(good.read_bytes())
    assert meta["images"] and meta["images"][0][2] < meta["images"][0][1]  # 16 cells in 4 positions
    cells = len(tokens)
    for bad in ([[0, 16, 17]], [[cells - 2, 16, 4]], [[5, 16, 4], [10, 16, 4]], [["0", 16, 4]], {"0": 1}, [[0, 0, 0]]):
        path = tmp_path / "bad.state"
        path.write_bytes(pack_state({**meta, "images": bad}, tokens, payload))
        assert not backend.load_state(path) and backend.context_used == 0
        assert backend.state_error == "holds image spans that do not fit its tokens", (bad, backend.state_error)
    assert backend.load_state(good) and backend.context_used == cells
