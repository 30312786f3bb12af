"""llama.cpp as the referee: its dry run (no_alloc, load_mode NONE, in a child
process) gives ``plan`` the compute and output buffers where the graph replay
does not cover a model, cross-checks them where it does, and refuses what
llama.cpp refuses, including what the rules miss. An abort or a hang in the dry
run costs the figure, never the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.plan import referee
from scripts.plan_conformance import CASES
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.cli import cli


def _plan(*args: str) -> dict:
    r = cli("plan", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_where_the_replay_covers_the_model_the_dry_run_agrees(smollm2: Path) -> None:
    d = _plan(str(smollm2), "--ctx", "4096", "--kv-type", "q8_0")
    assert d["sources"]["compute"] == "graph replay" and d["sources"]["kv_cache"] == "llama.cpp's rules"
    dry = d["dry_run"]["buffers"]["CPU"]["compute"]
    assert abs(dry - d["compute_bytes"]) <= 0.006 * 2**20  # llama.cpp prints MiB to two decimals
    assert d["compute_cpu_bytes"] == d["compute_bytes"]


@pytest.mark.slow
def test_where_it_does_not_the_figure_is_llama_cpps_own(tmp_path: Path) -> None:
    """A deci model (an architecture the replay does not cover): plan's compute
    is the dry run's, and it equals what a real load allocates."""
    from localllm.engine import LlamaCppBackend

    path = write_gguf(tmp_path / "deci.gguf", SynthSpec(arch="deci", name="synthetic-deci", n_embd=128, n_head=4, kv_heads_per_layer=(4, 1)))
    d = _plan(str(path), "--ctx", "1024")
    # llama.cpp's figure, so not an estimate: the JSON says what the table says (issue 45 item 7)
    assert d["compute_estimated"] is False and d["sources"]["compute"] == "llama.cpp's dry run"
    with LlamaCppBackend() as b:
        b.load(path, LoadConfig(n_ctx=1024))
        real = sum(b.logged_buffers["CPU"]["compute"])
    assert d["compute_cpu_bytes"] / 2**20 == pytest.approx(real, abs=0.006)
    # the total is made of the figures shown
    assert d["total_cpu_bytes"] == d["weights_cpu_bytes"] + d["kv_cache_bytes"] + d["compute_cpu_bytes"] + d["output_cpu_bytes"]
    text = cli("plan", str(path), "--ctx", "1024").stdout
    assert "compute (llama.cpp's dry run)" in text and "the graph replay does not cover this model" in text


@pytest.mark.slow
def test_plan_refuses_what_only_llama_cpp_knows(tmp_path: Path) -> None:
    """MLA (deepseek2) keeps one latent cache: llama.cpp refuses different K and
    V types, a rule localllm does not write down. The dry run says so."""
    path = write_gguf(tmp_path / "ds2.gguf", CASES["deepseek2"])
    r = cli("plan", str(path), "--ctx", "512", "--k-type", "q8_0", "--v-type", "f16")
    assert r.returncode == 1
    assert "llama.cpp refuses this config" in r.stderr and "does not support different K (q8_0) and V (f16) cache types" in r.stderr


@pytest.mark.slow
def test_an_abort_in_the_dry_run_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    """Head size 80, one KV head, a q4_0 K without flash attention: llama.cpp
    aborts in ggml; the child dies, the caller gets llama.cpp's assertion."""
    path = write_gguf(tmp_path / "h80.gguf", SynthSpec(n_embd=160, n_head=2, n_head_kv=1, n_ff=320))
    dry = referee.dry_run(path, LoadConfig(n_ctx=256, type_k="q4_0", type_v="f16", flash_attn="off"))
    assert dry.refused is not None and "GGML_ASSERT" in dry.refused and not dry.ok


def test_a_dry_run_past_its_time_limit_gives_no_figure(smollm2: Path) -> None:
    dry = referee.dry_run(smollm2, LoadConfig(n_ctx=512), timeout=0.001)
    assert dry.failed is not None and "took over" in dry.failed and dry.buffers == {}


@pytest.mark.slow
def test_no_dry_run_says_so(smollm2: Path) -> None:
    d = _plan(str(smollm2), "--ctx", "1024", "--no-dry-run")
    assert d["dry_run"] is None and d["sources"]["compute"] == "graph replay"
    assert "llama.cpp's dry run: not run" in cli("plan", str(smollm2), "--ctx", "1024", "--no-dry-run").stdout
