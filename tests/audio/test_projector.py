"""What an audio projector's header says (localllm.audio.projector, vision.projector), and inspect / list showing it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localllm.audio.projector import describe_audio
from localllm.commands import list_models
from localllm.commands.inspect import capabilities
from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header
from localllm.vision.projector import check_pair, read_projector
from scripts.make_audio_projector import AudioSpec, tokens_per_chunk, write_audio_projector
from tests.helpers.cli import cli


def test_the_audio_figures_follow_clip_cpp(tmp_path: Path, audio_projector: Path) -> None:
    ux = describe_audio(read_header(audio_projector))
    assert ux is not None and (ux.projector_type, ux.n_mel, ux.n_embd, ux.stack, ux.n_embd_out) == ("ultravox", 128, 64, 12, 576)
    assert ux.tokens_per_chunk == tokens_per_chunk(AudioSpec()) == 125
    assert [ux.chunks(s) for s in (0.5, 10, 29.9, 30, 59, 600)] == [1, 1, 1, 2, 2, 21]  # 30 s of silence padded, whole chunks kept
    q = describe_audio(read_header(write_audio_projector(tmp_path / "q.gguf", AudioSpec(kind="qwen2a", n_embd_text=96))))
    assert q is not None and (q.projector_type, q.stack, q.tokens_per_chunk, q.n_embd_out) == ("qwen2a", None, 750, 96)


def test_an_audio_only_projector_fits_smollm2(smollm2: Path, audio_projector: Path, tmp_path: Path) -> None:
    info = read_projector(audio_projector)
    assert info.has_audio and not info.has_vision and info.n_embd_out == 576
    assert info.line() == "projector mmproj-audio.gguf (ultravox, audio only)"
    assert capabilities(info) == "audio" and capabilities(None) == "text only"
    check_pair(read_header(smollm2), info)  # no error: the widths match
    narrow = read_projector(write_audio_projector(tmp_path / "n.gguf", AudioSpec(n_embd_text=64)))
    with pytest.raises(InputError, match="hands over 64-wide embeddings, the model's n_embd is 576"):
        check_pair(read_header(smollm2), narrow)


@pytest.fixture()
def model_dir(tmp_path: Path, smollm2: Path, audio_projector: Path) -> Path:
    """SmolLM2 with the audio projector beside it (as a Hub snapshot holds them)."""
    os.symlink(smollm2, tmp_path / "SmolLM2.gguf")
    os.symlink(audio_projector, tmp_path / "mmproj-SmolLM2.gguf")
    return tmp_path / "SmolLM2.gguf"


def test_inspect_shows_audio_capability(model_dir: Path) -> None:
    text = cli("inspect", str(model_dir))
    assert text.returncode == 0, text.stderr
    assert "takes             audio" in text.stdout and "audio encoder     ultravox, 128 mel bins, 125 tokens each 30 s" in text.stdout
    out = json.loads(cli("inspect", str(model_dir), "--json").stdout)
    assert out["capabilities"] == {"vision": False, "audio": True} and out["audio_encoder"]["tokens_per_chunk"] == 125
    alone = json.loads(cli("inspect", str(model_dir.parent / "mmproj-SmolLM2.gguf"), "--json").stdout)
    assert alone["capabilities"]["audio"] is True and alone["projector"]["has_audio"] is True


def test_list_names_what_the_projector_takes(model_dir: Path, smollm2: Path) -> None:
    near = list_models._projector(model_dir, read_header(smollm2))
    assert near is not None and list_models._media(near) == "audio" and list_models._media(None) is None
    row = list_models.Row("smol", "store", None, str(model_dir), "llama", "Q4_1", 1, 2048, True, "fits", None, str(near), "audio")
    assert "smol (audio)" in list_models.render([row], "(RAM)", columns=120)


@pytest.mark.slow
def test_the_audio_encoders_compute_estimate_is_near_what_clip_cpp_allocates(smollm2: Path, tmp_path: Path) -> None:
    """plan's figure for the audio encoder's compute buffer (``AudioInfo.compute_estimate``) against clip.cpp's logged one."""
    from localllm.engine.llama import LlamaCppBackend
    from localllm.engine_api import LoadConfig

    specs = [AudioSpec(), AudioSpec(n_embd=256, n_ff=1024, n_head=4, n_block=2), AudioSpec(n_embd=128, n_ff=256, n_mel=80),
             AudioSpec(kind="qwen2a", n_embd=384, n_ff=1536, n_head=6)]
    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=256, n_threads=2))
        for i, spec in enumerate(specs):
            path = write_audio_projector(tmp_path / f"a{i}.gguf", spec)
            b.load_projector(path)
            logged = sum(b.projector.logged_memory.compute_bytes.values())
            planned = b.projector.planned_memory
            assert planned.compute_bytes is not None and abs(planned.compute_bytes / logged - 1) < 0.03, (spec, planned, logged)
    r = cli("plan", str(smollm2), "--mmproj", str(path), "--ctx", "1024", "--json")
    mem = json.loads(r.stdout)["projector"]["memory"]
    assert mem["compute_bytes"] == describe_audio(read_header(path)).compute_estimate() and "30 s chunk" in mem["compute_source"]
