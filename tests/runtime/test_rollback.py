"""``runtime.reload_or_restore``, the cockpit's switch of models: the model
loaded is closed before the new one loads (two may not fit), and loaded again
exactly as it was when the new one fails; a fit that fails never touches it."""

from __future__ import annotations

from pathlib import Path

from localllm import runtime
from localllm.errors import EngineError, InputError
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from tests.helpers.engines import FailingEngine

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)


def _current(synth_model: Path) -> tuple[FailingEngine, runtime.Previous]:
    old = FailingEngine()
    loaded = runtime.open_model(runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_ctx=512), hardware=ROOMY), old)
    return old, runtime.Previous(old, loaded.path, loaded.config)


def test_the_new_model_loads_and_the_old_one_is_closed(synth_model: Path) -> None:
    old, previous = _current(synth_model)
    new = FailingEngine()
    switched = runtime.reload_or_restore(previous, runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_ctx=1024),
                                                                       hardware=ROOMY), lambda: new)
    assert switched.loaded is not None and switched.error is None and switched.loaded.engine is new
    assert new.config is not None and new.config.n_ctx == 1024 and old.closed == 1


def test_a_fit_that_fails_leaves_the_loaded_model_alone(synth_model: Path, tmp_path: Path) -> None:
    old, previous = _current(synth_model)
    missing = runtime.reload_or_restore(previous, runtime.LoadRequest(model=tmp_path / "gone.gguf", hardware=ROOMY), FailingEngine)
    assert missing.loaded is None and isinstance(missing.error, InputError) and missing.kept
    huge = runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_gpu_layers=-1), vram="1MiB")
    too_big = runtime.reload_or_restore(previous, huge, FailingEngine)
    assert isinstance(too_big.error, runtime.DoesNotFit) and too_big.kept
    assert old.closed == 0 and old.loads == 1


def test_a_load_that_fails_brings_the_previous_model_back_as_it_was(synth_model: Path) -> None:
    old, previous = _current(synth_model)
    new = FailingEngine()
    new.fail = EngineError("llama.cpp could not allocate the KV cache")
    switched = runtime.reload_or_restore(previous, runtime.LoadRequest(model=synth_model, hardware=ROOMY), lambda: new)
    assert switched.loaded is None and switched.kept and str(switched.error) == "llama.cpp could not allocate the KV cache"
    assert new.closed == 1  # the half-made new one is not left beside it
    assert old.closed == 1 and old.loads == 2 and old.config == previous.config  # closed first, then loaded again with its config


def test_an_engine_that_cannot_be_made_is_a_failure_like_any_other(synth_model: Path) -> None:
    old, previous = _current(synth_model)

    def factory() -> FailingEngine:
        raise RuntimeError("no engine here")

    switched = runtime.reload_or_restore(previous, runtime.LoadRequest(model=synth_model, hardware=ROOMY), factory)
    assert switched.kept and isinstance(switched.error, RuntimeError) and old.loads == 2
    alone = runtime.reload_or_restore(None, runtime.LoadRequest(model=synth_model, hardware=ROOMY), factory)
    assert alone.loaded is None and not alone.kept


def test_when_the_previous_model_fails_too_both_reasons_are_kept(synth_model: Path) -> None:
    old, previous = _current(synth_model)
    old.fail = EngineError("the file went away")
    new = FailingEngine()
    new.fail = EngineError("refused")
    switched = runtime.reload_or_restore(previous, runtime.LoadRequest(model=synth_model, hardware=ROOMY), lambda: new)
    assert not switched.kept and str(switched.error) == "refused" and str(switched.restore_error) == "the file went away"


def test_the_previous_projector_on_an_engine_without_images_is_a_reason(synth_model: Path, tmp_path: Path) -> None:
    old, previous = _current(synth_model)
    with_projector = runtime.Previous(old, previous.path, previous.config, projector=tmp_path / "mmproj.gguf")
    new = FailingEngine()
    new.fail = EngineError("refused")
    switched = runtime.reload_or_restore(with_projector, runtime.LoadRequest(model=synth_model, hardware=ROOMY), lambda: new)
    assert switched.kept and isinstance(switched.projector_error, runtime.NoImages)
