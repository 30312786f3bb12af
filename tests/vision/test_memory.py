"""The projector's memory by clip.cpp's rules (vision.memory) against a real load's log lines."""

from __future__ import annotations

import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig
from localllm.vision.memory import MIB, parse_log
from scripts.make_vision_model import write_vision_model

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("size", ["small", "large"])
def test_planned_memory_matches_clip_cpp_log(tmp_path, size: str) -> None:
    model, proj = write_vision_model(tmp_path, size=size)  # large: SigLIP-so400m's width and 27x27 grid, one block
    b = LlamaCppBackend()
    try:
        b.load(model, LoadConfig(n_ctx=128, n_threads=1))
        b.load_projector(proj)
        plan, logged = b.projector.planned_memory, b.projector.logged_memory
    finally:
        b.close()
    assert logged.device == "CPU" == plan.device  # this build and machine: no GPU
    # weights: the tensor table's sizes are what clip.cpp sums and logs (to 0.01 MiB)
    assert logged.weights_bytes is not None and abs(plan.weights_bytes - logged.weights_bytes) <= 0.006 * MIB
    # compute: an estimate, within 25% (or the log's 0.01 MiB rounding) of the buffer clip.cpp reserved
    (got,) = logged.compute_bytes.values()
    assert plan.compute_bytes is not None
    assert abs(plan.compute_bytes - got) <= max(0.25 * got, 0.006 * MIB), (plan.compute_bytes / MIB, got / MIB)


def test_parse_log_reads_clip_lines() -> None:
    lines = ["clip_ctx: CLIP using CUDA0 backend", "load_hparams: model size:         812.50 MiB",
             "reserve_compute_meta:      CUDA0 compute buffer size =    18.52 MiB",
             "reserve_compute_meta:        CPU compute buffer size =     1.50 MiB"]
    got = parse_log(lines)
    assert got.device == "CUDA0" and got.weights_bytes == int(812.5 * MIB)
    assert got.compute_bytes == {"CUDA0": int(18.52 * MIB), "CPU": int(1.5 * MIB)}


def test_the_projector_counts_against_the_budget(tmp_path) -> None:
    from tests.helpers.cli import cli
    from tests.vision.conftest import noise_png

    model, _ = write_vision_model(tmp_path, size="large")  # ~34 MiB of weights, ~18 MiB of compute
    pic = tmp_path / "p.png"
    pic.write_bytes(noise_png(1))
    args = ("run", str(model), "-p", "hi", "-n", "1", "--ctx", "256", "--threads", "1", "--no-stats", "--image", str(pic))
    short = cli(*args, "--vram", "40M")
    assert short.returncode != 0
    assert "localllm: error: does not fit with the projector mmproj-model.gguf: it needs 52.13 MiB on the GPU" in short.stderr
    roomy = cli(*args, "--vram", "2G")
    assert roomy.returncode == 0, roomy.stderr


def test_second_turn_ttft_is_a_fraction_of_the_first(tmp_path) -> None:
    """The issue's figure: with SigLIP-so400m's grid (81 tokens, ~1 s to encode on one thread), a follow-up
    turn re-encodes nothing, so its TTFT is at most 0.2x the first turn's."""
    from localllm.chat.session import ChatSession
    from localllm.engine_api import SamplingConfig
    from localllm.vision.image import decode_image
    from tests.vision.conftest import noise_png

    model, proj = write_vision_model(tmp_path, size="large")
    b = LlamaCppBackend()
    try:
        b.load(model, LoadConfig(n_ctx=512, n_threads=1))
        b.load_projector(proj)
        b.use_template("chatml")
        session = ChatSession(b, sampling=SamplingConfig(temperature=0, max_tokens=2))
        for text, images in (("what is it?", [decode_image(noise_png(1))]), ("and the colours?", None)):
            with session.send(text, images=images) as g:
                list(g)
        first, second = (t.stats for t in session.turns)
    finally:
        b.close()
    assert first.images == 1 and second.images == 0 and b.projector is None
    assert first.ttft_ms is not None and second.ttft_ms is not None
    assert second.ttft_ms <= 0.2 * first.ttft_ms, (first.ttft_ms, second.ttft_ms, first.encode_ms)
