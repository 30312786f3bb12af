"""llama.cpp's cache and flash-attention rules (localllm/engine_api/llama_rules.py),
checked against gguf-py's own copy of ggml's type table and against the
vendored llama.cpp source itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig, llama_rules
from localllm.errors import UsageError
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def vendored() -> Path:
    """The llama.cpp vendored in the pinned llama-cpp-python, fetched (once, from
    PyPI) and cached where scripts/build_llama_tools.sh keeps it."""
    out = subprocess.run([str(REPO / "scripts" / "build_llama_tools.sh"), "--source"], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


def test_cache_types_match_ggml_as_gguf_py_knows_it() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, t in llama_rules.CACHE_TYPES.items():
        g = GGMLQuantizationType[name.upper()]
        assert t.ggml_id == g.value, name
        assert (t.block_size, t.type_size) == GGML_QUANT_SIZES[g], name


@pytest.mark.slow
def test_cache_type_list_is_llamas(vendored: Path) -> None:
    src = (vendored / "common/arg.cpp").read_text()
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


def test_with_flash_attention_the_block_must_divide_the_head_size() -> None:
    """On or auto alike (llama.cpp checks unless flash attention is off)."""
    with pytest.raises(UsageError, match="K cache type q8_0 stores blocks of 32 values but this model's K head dim is 80"):
        llama_rules.check_cache_types("q8_0", "f16", 80, 80, flash_attn=True, k_rows=[160])
    with pytest.raises(UsageError) as info:
        llama_rules.check_cache_types("q4_0", "f16", 80, 80, flash_attn=True, k_rows=[160])
    assert "flash_attn off" in str(info.value)  # a K row of 160 is whole blocks: off would work
    with pytest.raises(UsageError) as info:
        llama_rules.check_cache_types("q4_0", "f16", 80, 80, flash_attn=True, k_rows=[80])
    assert "flash_attn" not in str(info.value)  # a row of 80 aborts with it off too: no such advice


def test_with_flash_attention_off_the_k_row_must_be_whole_blocks() -> None:
    llama_rules.check_cache_types("q4_0", "f16", 80, 80, flash_attn=False, k_rows=[160])  # two KV heads
    with pytest.raises(UsageError, match="K row of this model .* is 80 values"):
        llama_rules.check_cache_types("q4_0", "f16", 80, 80, flash_attn=False, k_rows=[80])  # one KV head
    with pytest.raises(UsageError, match="needs flash attention"):
        llama_rules.check_cache_types("f16", "q8_0", 64, 64, flash_attn=False, k_rows=[128])
    llama_rules.check_cache_types("f16", "f16", 80, 80, flash_attn=False, k_rows=[80])
