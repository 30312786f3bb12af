"""llama.cpp's cache and flash-attention rules (localllm/llama_rules.py),
checked against gguf-py's own copy of ggml's type table and, where the vendored
llama.cpp source is on this machine, against the source itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig, llama_rules
from localllm.errors import UsageError

VENDORED = Path("/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp")


def test_cache_types_match_ggml_as_gguf_py_knows_it() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, t in llama_rules.CACHE_TYPES.items():
        g = GGMLQuantizationType[name.upper()]
        assert t.ggml_id == g.value, name
        assert (t.block_size, t.type_size) == GGML_QUANT_SIZES[g], name


@pytest.mark.skipif(not (VENDORED / "common/arg.cpp").exists(), reason="the vendored llama.cpp source is not on this machine")
def test_cache_type_list_is_llamas() -> None:
    src = (VENDORED / "common/arg.cpp").read_text()
    body = re.search(r"kv_cache_types = \{(.*?)\};", src, re.S).group(1)  # type: ignore[union-attr]
    assert llama_rules.KV_CACHE_TYPES == tuple(n.lower() for n in re.findall(r"GGML_TYPE_(\w+)", body))


def test_quantized_v_needs_flash_attention() -> None:
    assert [t for t in llama_rules.KV_CACHE_TYPES if llama_rules.needs_flash_attn(t)] == ["q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
    assert llama_rules.flash_attn_mode("off", "q8_0") == "on" and llama_rules.flash_attn_mode("off", "f16") == "off"
    assert llama_rules.flash_attn_mode("auto", "f16") == "auto"
    # The planner plans 'auto' as on, and a quantized V as on whatever was asked.
    assert LoadConfig(flash_attn="auto").uses_flash_attn and not LoadConfig(flash_attn="off").uses_flash_attn
    assert LoadConfig(flash_attn="off", type_v="q4_0").uses_flash_attn


def test_block_sizes_must_divide_the_head_dim() -> None:
    llama_rules.check_cache_types("q8_0", "q4_0", 64, 64)
    with pytest.raises(UsageError, match="V cache type q4_0 stores blocks of 32 values but this model's V head dim is 80"):
        llama_rules.check_cache_types("f16", "q4_0", 64, 80)
    with pytest.raises(UsageError, match="unsupported cache type 'q3_k'"):
        llama_rules.ggml_type_id("q3_k")


def test_physical_batch_never_above_the_logical_one() -> None:
    assert LoadConfig(n_batch=256, n_ubatch=512).n_ubatch == 256
    assert LoadConfig(n_batch=512, n_ubatch=128).n_ubatch == 128
    assert llama_rules.ubatch(512, 0) == 512  # 0: the logical batch
