"""``runtime.open_model`` on the scripted engine: what the fit chose is what
loads, a model that does not fit is a typed ``DoesNotFit`` (an ``InputError``,
"does not fit: ..."), a failure closes the engine, the default context is the
plan's, and one load reads the model's header once."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm import runtime
from localllm.errors import EngineError, InputError
from localllm.modelfile import gguf_file
from localllm.modelfile.lora import AdapterSpec
from localllm.modelfile.model_info import describe
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.testing import ScriptedEngine
from tests.helpers.engines import FailingEngine

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)  # no GPU, RAM to spare: the fit keeps what is asked


def test_what_the_fit_chose_is_what_loads(synth_model: Path) -> None:
    engine = FailingEngine()
    request = runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_ctx=512, n_batch=256), hardware=ROOMY)
    with runtime.open_model(request, engine) as loaded:
        assert loaded.engine is engine and engine.config == loaded.config == loaded.planned.fit.config
        assert (loaded.config.n_ctx, loaded.config.n_batch) == (512, 256)
        assert loaded.path == synth_model and loaded.info.n_ctx == 512
        assert loaded.memory_check is None  # the fake logs no allocations: n/a, not a failure
        assert loaded.adapters == [] and loaded.projector is None
    assert engine.closed == 1


def test_one_load_reads_the_header_once(synth_model: Path, header_reads: list[str]) -> None:
    """resolve, fit, load, memory check: the header is read by ``runtime.plan``
    and handed on, never read again by the fit or the check."""
    seen = header_reads
    with runtime.open_model(runtime.LoadRequest(model=synth_model, hardware=ROOMY), ScriptedEngine()):
        pass
    assert seen == ["localllm.runtime.planning"]


def test_a_model_that_does_not_fit_is_a_typed_error_and_nothing_loads(synth_model: Path) -> None:
    engine = FailingEngine()
    request = runtime.LoadRequest(model=synth_model, options=fitting.LoadOptions(n_gpu_layers=-1), vram="1MiB")
    with pytest.raises(runtime.DoesNotFit, match=r"^does not fit: ") as caught:
        runtime.open_model(request, engine)
    assert isinstance(caught.value, InputError) and caught.value.exit_code == 1
    assert caught.value.fit is not None and not caught.value.fit.fits
    assert str(caught.value) == f"does not fit: {caught.value.fit.sentence}"
    assert engine.loads == 0
    planned = runtime.plan(request)  # planning alone never raises for it: ``plan`` shows such a fit
    assert not planned.fit.fits


def test_the_routers_does_not_fit_is_the_same_error() -> None:
    from localllm.router.pool import DoesNotFit, LoadFailed

    err = DoesNotFit("big does not fit: even with every layer on the CPU it needs 9 GiB")
    assert isinstance(err, runtime.DoesNotFit) and isinstance(err, LoadFailed) and isinstance(err, InputError)
    assert err.fit is None and type(err)(str(err)).args == err.args  # the pool makes fresh ones from the words


def test_a_failed_load_closes_the_engine(synth_model: Path) -> None:
    engine = FailingEngine(fail=EngineError("llama.cpp could not load it"))
    with pytest.raises(EngineError, match="could not load"):
        runtime.open_model(runtime.LoadRequest(model=synth_model, hardware=ROOMY), engine)
    assert engine.closed == 1


def test_lora_on_an_engine_without_adapters_fails_and_closes(synth_model: Path, tmp_path: Path) -> None:
    from scripts.synth_gguf import write_lora_gguf

    engine = FailingEngine()
    lora = (AdapterSpec(write_lora_gguf(tmp_path / "a.gguf")),)
    with pytest.raises(InputError, match="this engine cannot load LoRA adapters"):
        runtime.open_model(runtime.LoadRequest(model=synth_model, hardware=ROOMY, lora=lora), engine)
    assert engine.loads == 1 and engine.closed == 1
    fit = runtime.plan(runtime.LoadRequest(model=synth_model, hardware=ROOMY, lora=lora)).fit
    assert fit.plan.total_cpu_bytes > runtime.plan(runtime.LoadRequest(model=synth_model, hardware=ROOMY)).fit.plan.total_cpu_bytes


def test_no_context_given_is_the_plans_default(synth_model: Path) -> None:
    """Not 4096 written into a front end: ``fitting.default_ctx`` of the trained
    context, a conversation's at most 4096, a server's the trained one per sequence."""
    trained = describe(gguf_file.read_header(synth_model)).context_length
    one = runtime.plan(runtime.LoadRequest(model=synth_model, hardware=ROOMY))
    assert one.config.n_ctx == fitting.default_ctx(trained) == min(trained or 4096, 4096)
    served = runtime.plan(runtime.LoadRequest(model=synth_model, hardware=ROOMY, parallel=3, serving=True))
    assert served.config.n_ctx == 3 * fitting.default_ctx(trained, serving=True) and served.fit.ctx_default
    assert served.config.n_seq == 3 and served.config.kv_unified


def test_a_server_pool_is_a_whole_number_of_sequences(synth_model: Path) -> None:
    planned = runtime.plan(runtime.LoadRequest(model=synth_model, hardware=ROOMY, options=fitting.LoadOptions(n_ctx=1000), parallel=3,
                                               serving=True))
    assert planned.lp.config.n_ctx == 1000 and planned.config.n_ctx == 999


def test_the_template_is_set(synth_model: Path) -> None:
    engine = ScriptedEngine(chat_template=False)
    with runtime.open_model(runtime.LoadRequest(model=synth_model, hardware=ROOMY, template="chatml"), engine):
        assert engine.has_chat_template  # the template given stands in for the model's


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from scripts.make_vision_model import write_vision_model

    return write_vision_model(tmp_path_factory.mktemp("vision"))


def test_a_projector_an_engine_cannot_load(vision: tuple[Path, Path]) -> None:
    """The cockpit's projector is optional: the model loads and the reason is
    kept (it runs text only); run's is not: the load fails and the engine is closed."""
    model, projector = vision
    optional = runtime.LoadRequest(model=model, hardware=ROOMY, projector=projector, projector_optional=True)
    with runtime.open_model(optional, ScriptedEngine()) as loaded:
        assert loaded.projector is None and isinstance(loaded.projector_error, runtime.NoImages)
    engine = FailingEngine()
    with pytest.raises(runtime.NoImages, match="this engine takes no images"):
        runtime.open_model(runtime.LoadRequest(model=model, hardware=ROOMY, projector=projector), engine)
    assert engine.closed == 1


def test_a_projector_that_does_not_fit_beside_the_model_is_refused_before_the_load(vision: tuple[Path, Path]) -> None:
    model, projector = vision
    engine = FailingEngine()
    tight = runtime.plan(runtime.LoadRequest(model=model, hardware=ROOMY))
    ram = tight.fit.plan.total_cpu_bytes + 1  # room for the model, not for the projector beside it
    hw = Hardware(None, None, None, "none", ram, ram)
    with pytest.raises(InputError, match="does not fit with the projector"):
        runtime.open_model(runtime.LoadRequest(model=model, hardware=hw, projector=projector), engine)
    assert engine.loads == 0
