"""``import localllm``: the library API, pinned as httpx pins its public names,
driven on the scripted engine (fast) and on llama.cpp (the README's script)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import localllm
from localllm.testing import ScriptedEngine
from tests.helpers.paths import REPO

PUBLIC = [
    "Conversation", "Engine", "EngineError", "Fit", "Generation", "GenerationStats", "InputError", "LoadConfig",
    "LocalLLMError", "Model", "Response", "SamplingConfig", "UsageError", "__version__", "fit", "load",
    "quantize_model", "resolve",
]


def test_the_public_names_are_pinned() -> None:
    """Adding or removing a public name is a decision: this list changes with it."""
    assert sorted(localllm.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(localllm, name) is not None, name
    with pytest.raises(AttributeError):
        localllm.no_such_name  # noqa: B018


def test_import_localllm_loads_nothing_heavy() -> None:
    """``localllm --help`` and ``localllm.__version__`` pay for neither llama.cpp
    nor numpy: the API loads on first use."""
    code = "import sys, localllm; print(localllm.__version__, sorted(m for m in ('llama_cpp', 'numpy', 'textual') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == f"{localllm.__version__} []"


def test_fit_reads_the_header_only(smollm2: Path) -> None:
    fit = localllm.fit(smollm2, ctx=2048, vram="1GiB", kv_type="q8_0")
    assert fit.fits and fit.config.n_ctx == 2048 and (fit.config.type_k, fit.config.type_v) == ("q8_0", "q8_0")
    assert fit.gpu_budget == 1024**3
    tiny = localllm.fit(smollm2, vram="1MiB", n_gpu_layers=-1)  # the layers fixed on a 1 MiB GPU: does not fit
    assert not tiny.fits


def test_a_bad_size_is_a_usage_error(smollm2: Path) -> None:
    with pytest.raises(localllm.UsageError, match="is not a size"):
        localllm.fit(smollm2, vram="four gigs")


def test_load_chat_and_complete_stream_with_stats(smollm2: Path) -> None:
    engine = ScriptedEngine(ttft_ms=2, itl_ms=1, tokens=4, word="w")
    with localllm.load(smollm2, ctx=512, engine=engine) as model:
        assert model.config.n_ctx == 512 and engine.config == model.config
        reply = model.chat("Hello there", max_tokens=4)
        pieces = list(reply)
        assert pieces == [" w0", " w1", " w2", " w3"] and reply.text() == " w0 w1 w2 w3"
        assert reply.stats is not None and reply.stats.generated_tokens == 4 and reply.stats.ttft_ms >= 2
        assert model.complete("Once upon", max_tokens=2).text() == " w0 w1"
        talk = model.conversation(system="Be brief.")
        talk.send("one").text()
        talk.send("two").text()
        assert [m["role"] for m in talk.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert engine.context_used == 0  # closed


def test_load_refuses_what_does_not_fit(smollm2: Path) -> None:
    with pytest.raises(localllm.InputError, match="does not fit"):
        localllm.load(smollm2, vram="1MiB", n_gpu_layers=-1, engine=ScriptedEngine())


def test_an_unknown_model_is_an_input_error() -> None:
    with pytest.raises(localllm.InputError):
        localllm.load("no-such-model-anywhere", engine=ScriptedEngine())


def _readme_script() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"## As a library\n.*?```python\n(.*?)```", text, re.S)
    assert m, "the README has a library section with a Python script"
    return m.group(1)


@pytest.mark.slow
def test_the_readme_script_runs_on_llama_cpp() -> None:
    """The README's library example, run as written, on the default model."""
    script = _readme_script()
    assert len(script.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert re.search(r"TTFT \d+ ms, \d+ t/s", out.stdout), out.stdout
    assert out.stdout.split("TTFT")[0].strip(), "the reply streamed some text"


@pytest.mark.slow
def test_quantize_model_writes_a_smaller_file(tmp_path: Path) -> None:
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    src = write_llama_gguf(tmp_path / "tiny-F16.gguf", SynthSpec(dtype="f16"))
    seen: list[int] = []
    report = localllm.quantize_model(src, "Q8_0", on_progress=lambda p: seen.append(p.index))
    out = Path(report.output or "")
    assert out.is_file() and out.parent == tmp_path and report.type == "Q8_0"
    assert report.output_bytes == out.stat().st_size < src.stat().st_size
    assert seen, "progress was reported"
