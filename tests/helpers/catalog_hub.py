"""A catalog of tiny models served by the loopback Hub (``fake_hub``), for the
cockpit's catalog tab: the real catalog's models are GiBs on the real Hub, so a
test puts its own ``models/catalog.toml`` in its place (``use_catalog``) with
small synthetic GGUFs behind one entry and none behind the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.store import curated

TINY_REPO = "acme/Tiny-GGUF"
MISSING_REPO = "acme/Huge-GGUF"  # listed in the catalog, absent from the hub: a 404

# One small llama the hub serves (two quants); a Mistral-7B-like Q4_K_M too large
# for a 4 GiB GPU whole (fewer layers on it); a 70B at F16 (141 GB) that neither a
# 4 GiB GPU nor a laptop's RAM holds, and that the hub does not have. The shapes
# are given as the real catalog gives them (published configurations).
CATALOG = f"""
[[model]]
name = "tiny-chat"
repo = "{TINY_REPO}"
architecture = "llama"
license = "MIT"
context = 2048
n_layer = 2
n_embd = 128
n_head = 4
n_head_kv = 2
head_dim = 32
n_ff = 256
n_vocab = 360
files.Q8_0 = {{ file = "Tiny-Chat-Q8_0.gguf", size_gb = 0.001 }}
files.F16 = {{ file = "Tiny-Chat-F16.gguf", size_gb = 0.001 }}

[[model]]
name = "mid-model"
repo = "acme/Mid-GGUF"
architecture = "llama"
license = "Apache-2.0"
context = 32768
n_layer = 32
n_embd = 4096
n_head = 32
n_head_kv = 8
head_dim = 128
n_ff = 14336
n_vocab = 32768
files.Q4_K_M = {{ file = "Mid-Q4_K_M.gguf", size_gb = 4.37 }}

[[model]]
name = "huge-model"
repo = "{MISSING_REPO}"
architecture = "llama"
license = "Apache-2.0"
context = 8192
n_layer = 80
n_embd = 8192
n_head = 64
n_head_kv = 8
head_dim = 128
n_ff = 28672
n_vocab = 128256
files.F16 = {{ file = "Huge-F16.gguf", size_gb = 141.1 }}
"""


def use_catalog(monkeypatch: pytest.MonkeyPatch, text: str = CATALOG) -> None:
    """``text`` as the catalog for this test: ``list --catalog``, catalog names
    (``names.parse``), ``pull`` and the cockpit all read it."""
    monkeypatch.setattr(curated, "catalog_text", lambda: text)


def tiny_files(folder: Path) -> dict[str, Path]:
    """The two quants of tiny-chat (f16 weights, ~0.8 MB: a dozen of the fake
    hub's 64 KiB chunks, so a trickle makes a pull last long enough to watch)."""
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    return {
        "Tiny-Chat-Q8_0.gguf": write_llama_gguf(folder / "Tiny-Chat-Q8_0.gguf", SynthSpec(n_embd=128, n_ff=256, dtype="f16", seed=1)),
        "Tiny-Chat-F16.gguf": write_llama_gguf(folder / "Tiny-Chat-F16.gguf", SynthSpec(n_embd=128, n_ff=256, dtype="f16", seed=2)),
    }
