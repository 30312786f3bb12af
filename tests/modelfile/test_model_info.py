"""inspect's figures, checked against known values and against llama.cpp's own load log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localllm.modelfile.model_info import inspect_model
from scripts.synth_gguf import SynthSpec, vocabulary


def test_synthetic_model(synth_model: Path) -> None:
    info = inspect_model(synth_model)
    spec = SynthSpec()
    assert info.architecture == "llama"
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv)
    assert info.gqa_ratio == 2.0
    assert info.head_dim_k == info.head_dim_v == spec.n_embd // spec.n_head
    assert info.n_vocab == len(vocabulary()[0])
    assert info.file_type == "F32" and info.bits_per_weight == 32.0
    assert info.sliding_window is None and info.swa_layers == []
    assert info.chat_template is False
    n_vocab = info.n_vocab
    per_layer = 2 * spec.n_embd + spec.n_embd * spec.n_embd * 2 + 2 * spec.n_embd * (spec.n_embd // spec.n_head * spec.n_head_kv) + 3 * spec.n_embd * spec.n_ff
    assert info.n_params == 2 * n_vocab * spec.n_embd + spec.n_embd + spec.n_layer * per_layer


def test_smollm2(smollm2: Path) -> None:
    info = inspect_model(smollm2)
    d = info.to_dict()
    for key in ("architecture", "n_params", "size_bytes", "file_type", "bits_per_weight", "n_layer", "n_head", "n_head_kv",
                "head_dim_k", "head_dim_v", "context_length", "sliding_window", "swa_layers", "n_vocab", "chat_template"):
        assert key in d
    assert d["architecture"] == "llama" and d["file_type"] == "Q4_1"
    assert (d["n_layer"], d["n_head"], d["n_head_kv"], d["head_dim_k"]) == (30, 9, 3, 64)
    assert d["context_length"] == 8192 and d["n_vocab"] == 49152 and d["chat_template"] is True
    assert d["size_bytes"] == smollm2.stat().st_size
    assert {t["type"] for t in d["tensor_types"]} == {"Q4_1", "Q8_0", "F32"}


@pytest.mark.slow
def test_gemma_matches_llama_cpp_log(gemma: Path) -> None:
    """SWA layers, head counts and bits per weight agree with what llama.cpp prints on load."""
    from localllm.engine import ROUTER, LlamaCppBackend
    from localllm.engine_api import LoadConfig

    info = inspect_model(gemma)
    mark = ROUTER.mark()
    with LlamaCppBackend() as b:
        b.load(gemma, LoadConfig(n_ctx=1024))
    log = "\n".join(line for _, line in ROUTER.lines_since(mark))
    swa = [int(m.group(1)) for m in re.finditer(r"layer\s+(\d+) assigned to device \S+, is_swa = 1", log)]
    assert swa and info.swa_layers == swa
    assert info.sliding_window == int(re.search(r"n_swa\s+= (\d+)", log).group(1))
    assert info.n_head_kv == int(re.search(r"n_head_kv\s+= (\d+)", log).group(1))
    assert info.head_dim_k == int(re.search(r"n_embd_head_k\s+= (\d+)", log).group(1))
    assert f"({info.bits_per_weight:.2f} BPW)" in log
    assert info.n_vocab == 262144 and info.architecture == "gemma3" and not info.chat_template
