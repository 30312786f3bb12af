"""The load path on llama.cpp itself: SmolLM2 as ``run`` loads it (the memory
check of the load, the header read once outside the engine), serve's batch
engine with its sequences, LoRA adapters and a projector on the synthetic models."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm import runtime
from localllm.modelfile.lora import AdapterSpec
from localllm.plan import fitting
from localllm.plan.hardware import Hardware

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)

pytestmark = pytest.mark.slow


def test_smollm2_loads_checked_and_its_header_is_read_once_before_the_engine(smollm2: Path, header_reads: list[str]) -> None:
    """The header is read once (``runtime.plan``): the fit, the memory check and
    the engine's own checks before llama.cpp sees the file
    (``engine.model.ModelHandle.check``) take it from there."""
    seen = header_reads
    request = runtime.LoadRequest(model="smollm2", options=fitting.LoadOptions(n_ctx=512, threads=1, n_gpu_layers=0), hardware=ROOMY)
    with runtime.open_model(request) as loaded:
        assert loaded.path == smollm2 and loaded.info.n_ctx == 512
        assert loaded.memory_check is not None and loaded.memory_check.ok, loaded.memory_check
        text = loaded.engine.detokenize(loaded.engine.tokenize("Paris", add_special=False))
        assert text.strip() == "Paris"
    assert seen == ["localllm.runtime.planning"], seen


def test_no_context_given_loads_the_plans_default(smollm2: Path) -> None:
    with runtime.open_model(runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(threads=1, n_gpu_layers=0), hardware=ROOMY)) as loaded:
        assert loaded.info.n_ctx == fitting.default_ctx(loaded.planned.fit.trained_ctx) == 4096  # SmolLM2 is trained on 8192


def test_serves_batch_engine_with_its_sequences(smollm2: Path) -> None:
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=2 * 1000, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  parallel=2, serving=True, template="chatml")
    with runtime.open_model(request) as loaded:
        from localllm.engine.batch import BatchModel

        assert isinstance(loaded.engine, BatchModel)
        assert loaded.config.n_ctx == 2000 and loaded.info.n_seq == 2 and loaded.info.n_ctx >= 2000
        assert loaded.memory_check is None  # the batch engine keeps no load log


def test_lora_and_a_projector_load_after_the_model(synth_model: Path, tmp_path: Path) -> None:
    from scripts.make_vision_model import write_vision_model
    from scripts.synth_gguf import write_lora_gguf

    adapter = write_lora_gguf(tmp_path / "a.gguf")
    request = runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_ctx=256), hardware=ROOMY, lora=(AdapterSpec(adapter),))
    with runtime.open_model(request) as loaded:
        assert loaded.adapters == [adapter] and loaded.engine.adapters == [(adapter, 1.0)]
    model, projector = write_vision_model(tmp_path / "vision")
    with runtime.open_model(runtime.LoadRequest(model=model, options=fitting.LoadOptions(n_ctx=256), hardware=ROOMY, projector=projector)) as loaded:
        assert loaded.projector is not None and loaded.projector.path == projector and loaded.projector_error is None
