"""Projector headers: what they say, whether they fit a model, where one is found (vision.projector)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header
from localllm.vision.projector import beside, check_pair, read_projector, refuse_projector_as_model
from scripts.make_vision_model import LARGE, SMALL, tokens_per_image
from scripts.synth_gguf import SynthSpec, write_llama_gguf


def test_the_synthetic_projector_reads_as_clip_cpp_counts_it(vision_model) -> None:
    model, proj = vision_model
    info = read_projector(proj)
    assert (info.projector_type, info.image_size, info.patch_size, info.n_merge) == ("gemma3", 32, 4, 4)
    assert info.n_embd_out == 64 == read_header(model).arch_key("embedding_length")
    assert info.tokens_per_image == 4 == tokens_per_image(SMALL)  # (32/4)^2 / 4^2, clip_n_output_tokens
    assert proj.stat().st_size < 100_000
    check_pair(read_header(model), info)  # fits: no error


def test_large_spec_is_siglip_so400m_grid() -> None:
    assert (LARGE.n_embd, LARGE.image_size // LARGE.patch_size) == (1152, 27)
    assert tokens_per_image(LARGE) == 81


def test_another_width_is_one_line_naming_both(vision_model, tmp_path: Path) -> None:
    _, proj = vision_model
    other = write_llama_gguf(tmp_path / "other.gguf", SynthSpec(arch="gemma3", n_embd=32, n_head=2, n_head_kv=1))  # its family, another width
    with pytest.raises(InputError) as exc:
        check_pair(read_header(other), read_projector(proj))
    msg = str(exc.value)
    assert "mmproj-model.gguf" in msg and "other.gguf" in msg and "64" in msg and "32" in msg and "\n" not in msg


def test_projector_given_as_model_names_both(vision_model) -> None:
    model, proj = vision_model
    with pytest.raises(InputError, match=r"mmproj-model.gguf is a projector .*model.gguf as --mmproj"):
        refuse_projector_as_model(proj, read_header(proj), model)
    with pytest.raises(InputError, match="is not a projector"):
        read_projector(model)


def test_absurd_image_size_is_refused_before_libmtmd(tmp_path: Path) -> None:
    p = tmp_path / "mmproj-absurd.gguf"
    w = gguf.GGUFWriter(str(p), "clip")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.image_size", 4_000_000_000)
    w.add_uint32("clip.vision.patch_size", 14)
    w.add_tensor("mm.input_projection.weight", np.zeros((4, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match="absurd clip.vision.image_size"):
        read_projector(p)


def test_found_beside_the_model(vision_model, tmp_path: Path) -> None:
    model, proj = vision_model
    assert beside(model) == proj
    alone = write_llama_gguf(tmp_path / "alone.gguf", SynthSpec())
    assert beside(alone) is None


def test_a_tensor_type_llama_cpp_would_abort_on_is_refused(tmp_path: Path) -> None:
    # v.position_embd in F16: clip.cpp's ggml_add has no f32 + f16 kernel on the CPU and aborts the process
    p = tmp_path / "mmproj-f16pos.gguf"
    w = gguf.GGUFWriter(str(p), "clip")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.image_size", 32)
    w.add_uint32("clip.vision.patch_size", 4)
    w.add_tensor("v.position_embd.weight", np.zeros((64, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match="stores v.position_embd.weight as F16, where llama.cpp wants F32"):
        read_projector(p)
