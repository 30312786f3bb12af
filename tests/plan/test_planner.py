"""The memory planner: exact KV figures, the offload rule, fitting, and accuracy
against what llama.cpp itself allocates (its log, captured through llama_log_set)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting
from localllm.plan.hardware import parse_size
from localllm.plan.planner import MiB, ModelShape, kv_cells, offload, plan_memory, row_bytes
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli

GiB = 1024 * MiB


def shape_of(path: Path) -> ModelShape:
    return ModelShape.from_header(read_header(path))


@pytest.fixture(scope="session")
def synth_pair(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two synthetic architectures with realistic proportions: a GQA llama and a
    Gemma 3 with sliding-window layers, a tied output and 256-wide heads."""
    d = tmp_path_factory.mktemp("planner")
    return [
        write_llama_gguf(d / "llama.gguf", SynthSpec(n_layer=2, n_embd=512, n_head=8, n_head_kv=4, n_ff=1408, dtype="f16")),
        write_llama_gguf(
            d / "gemma3.gguf",
            SynthSpec(
                arch="gemma3",
                n_layer=6,
                n_embd=640,
                n_head=4,
                n_head_kv=1,
                head_dim=256,
                n_ff=2048,
                sliding_window=512,
                tied_output=True,
                dtype="f16",
                name="synthetic-gemma3",
            ),
        ),
    ]


def test_row_bytes_are_block_accurate() -> None:
    assert row_bytes("f16", 64) == 128 and row_bytes("f32", 64) == 256
    assert row_bytes("q8_0", 64) == 2 * 34 and row_bytes("q4_0", 64) == 2 * 18
    assert row_bytes("q4_1", 32) == 20 and row_bytes("q5_0", 32) == 22 and row_bytes("q5_1", 32) == 24
    assert row_bytes("iq4_nl", 32) == 18 and row_bytes("bf16", 10) == 20


@pytest.mark.slow
def test_context_padding_and_swa_cells(gemma: Path, smollm2: Path) -> None:
    g = shape_of(gemma)
    assert kv_cells(g, LoadConfig(n_ctx=1000, n_outputs_max=0)) == (1024, 1024)
    assert kv_cells(g, LoadConfig(n_ctx=4096, n_outputs_max=0)) == (4096, 1024)  # 512-token window + 512 ubatch
    assert kv_cells(g, LoadConfig(n_ctx=4096, swa_full=True, n_outputs_max=0)) == (4096, 4096)
    assert kv_cells(g, LoadConfig(n_ctx=4096, n_ubatch=128, n_outputs_max=0)) == (4096, 768)
    s = shape_of(smollm2)
    assert kv_cells(s, LoadConfig(n_ctx=1, n_outputs_max=0)) == (256, 256)


def test_kv_bytes_smollm2_by_hand(smollm2: Path) -> None:
    p = plan_memory(shape_of(smollm2), LoadConfig(n_ctx=4096, n_outputs_max=0))
    # 30 layers x 4096 cells x (3 KV heads x 64) x 2 (K and V) x 2 bytes
    assert p.kv_cache_bytes == 30 * 4096 * 192 * 2 * 2 == 90 * MiB
    assert p.kv_bytes_per_token == 30 * 192 * 2 * 2
    q8 = plan_memory(shape_of(smollm2), LoadConfig(n_ctx=4096, type_k="q8_0", type_v="q8_0", n_outputs_max=0))
    assert q8.kv_cache_bytes == 30 * 4096 * (192 // 32 * 34) * 2


def test_offload_rule(gemma: Path) -> None:
    g = shape_of(gemma)  # 18 layers + the output layer
    assert offload(g, 0, True) == (set(), False, 0)
    assert offload(g, 1, True) == (set(), True, 1)  # the output layer goes first
    assert offload(g, 5, True) == ({14, 15, 16, 17}, True, 5)
    assert offload(g, -1, True) == (set(range(18)), True, 19)
    assert offload(g, 99, True) == (set(range(18)), True, 19)
    assert offload(g, -1, False) == (set(), False, 0)
    full = plan_memory(g, LoadConfig(n_ctx=4096, n_gpu_layers=-1, n_outputs_max=0), gpu=True)
    cpu = plan_memory(g, LoadConfig(n_ctx=4096, n_outputs_max=0), gpu=False)
    # Tied output: the GPU gets a copy of token_embd, the CPU keeps the original.
    assert full.weights_gpu_bytes == sum(g.layer_bytes) + g.output_bytes + g.tied_bytes
    assert cpu.weights_cpu_bytes == sum(t.n_bytes for t in read_header(gemma).tensors)


def test_parse_size() -> None:
    assert parse_size("4GiB") == 4 * GiB and parse_size("6GB") == 6 * 10**9 and parse_size("512MiB") == 512 * MiB
    assert parse_size("4") == 4 * GiB and parse_size("1.5 GiB") == int(1.5 * GiB)
    for bad in ("-1", "0", "abc", "4XB", ""):
        with pytest.raises(Exception, match="size"):
            parse_size(bad)


@pytest.mark.slow
def fit(shape: ModelShape, want: LoadConfig, *, gpu_budget: int | None, ram: int | None, policy: str = "ctx") -> fitting.Fit:
    """The one fit (every device set goes through placement.fit_across), for one GPU budget."""
    return fitting.fit(shape, fitting.Request(want, policy=policy), fitting.Budget(gpu_budget, ram))


def test_fit_prefers_cheaper_cache_then_policy(gemma: Path) -> None:
    g = shape_of(gemma)
    want = LoadConfig(n_ctx=32768, n_outputs_max=1)
    r = fit(g, want, gpu_budget=350 * MiB, ram=None, policy="ctx")
    assert r.fits and r.plan.total_gpu_bytes <= 350 * MiB - r.margin
    assert r.config.type_k == "q8_0" or r.config.n_ctx < 32768
    o = fit(g, want, gpu_budget=350 * MiB, ram=None, policy="offload")
    assert o.fits and o.config.n_ctx == 32768 and o.config.n_gpu_layers < 19
    big = fit(g, want, gpu_budget=4 * GiB, ram=None)
    assert big.fits and big.sentence == "fits as asked" and big.config == want
    assert big.max_ctx_by_kv_type["q4_0"] >= big.max_ctx_by_kv_type["q8_0"] >= big.max_ctx_by_kv_type["f16"] > 0


@pytest.mark.slow
def test_budget_too_small_for_one_layer_explains(gemma: Path) -> None:
    r = fit(shape_of(gemma), LoadConfig(n_ctx=4096, n_outputs_max=0), gpu_budget=150 * MiB, ram=None)
    assert r.fits and r.config.n_gpu_layers == 0
    assert "too small for even one layer" in r.sentence
    none = fit(shape_of(gemma), LoadConfig(n_ctx=4096, n_outputs_max=0), gpu_budget=150 * MiB, ram=50 * MiB)
    assert not none.fits and "RAM" in none.sentence


@pytest.mark.slow
def test_plan_cli_json(smollm2: Path) -> None:
    proc = cli("plan", "--vram", "4GiB", "--ctx", "4096", "--json")
    assert proc.returncode == 0, proc.stderr
    import json

    d = json.loads(proc.stdout)
    for key in (
        "kv_cache_bytes",
        "kv_bytes_per_token",
        "weights_gpu_bytes",
        "weights_cpu_bytes",
        "compute_bytes",
        "output_bytes",
        "total_gpu_bytes",
        "total_cpu_bytes",
        "n_gpu_layers",
        "n_ctx",
        "type_k",
        "type_v",
        "swa_full",
        "fits",
        "max_ctx_by_kv_type",
    ):
        assert key in d, key
    assert d["fits"] is True and d["n_gpu_layers"] == 31 and d["kv_cache_bytes"] == 90 * MiB


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--vram", "-1"], "not a size"),
        (["--ctx", "0"], "--ctx must be at least 1"),
        (["--kv-type", "q3"], "invalid choice"),
        (["--vram", "lots"], "not a size"),
    ],
)
def test_plan_usage_errors(args: list[str], needle: str) -> None:
    proc = cli("plan", *args)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_run_with_vram_says_what_it_chose(gemma: Path) -> None:
    proc = cli(
        "run",
        str(gemma),
        "--raw",
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
        "--vram",
        "350MiB",
        "--ctx",
        "32768",
        "--policy",
        "offload",
        "--no-stats",
    )
    assert proc.returncode == 0, proc.stderr
    assert "fitted to --vram 350.00 MiB" in proc.stderr and "layers on the GPU" in proc.stderr


# -- accuracy against llama.cpp's own allocation log ---------------------------------

_KV_RE = re.compile(r"KV buffer size =\s+([\d.]+) MiB")
_COMPUTE_RE = re.compile(r"CPU compute buffer size =\s+([\d.]+) MiB")
_OUTPUT_RE = re.compile(r"output buffer size =\s+([\d.]+) MiB")


def _llama_cpp_buffers(path: Path, cfg: LoadConfig) -> tuple[list[float], float, float]:
    from localllm.engine import ROUTER, LlamaCppBackend
    from localllm.engine_api import LoadConfig

    mark = ROUTER.mark()
    with LlamaCppBackend() as b:
        b.load(path, LoadConfig(n_ctx=cfg.n_ctx, type_k=cfg.type_k, type_v=cfg.type_v, swa_full=cfg.swa_full, n_outputs_max=cfg.n_outputs_max, flash_attn="on"))
    log = "\n".join(line for _, line in ROUTER.lines_since(mark))
    return [float(x) for x in _KV_RE.findall(log)], float(_COMPUTE_RE.search(log).group(1)), float(_OUTPUT_RE.search(log).group(1))


GRID = [(n_ctx, kv, swa_full, n_out) for n_ctx in (256, 1000, 4096) for kv in ("f16", "q8_0", "q4_0") for swa_full in (False, True) for n_out in (1, 0)]
# The real Gemma 3 270M (a load is ~1 s with its 262k vocabulary): every pair of settings once (an
# orthogonal array of 9 rows over the 36), where the synthetic files of the same architectures take the whole grid.
PAIRS = [(n_ctx, kv, swa_full, n_out) for (n_ctx, kv), swa_full, n_out in zip(
    [(n, k) for n in (256, 1000, 4096) for k in ("f16", "q8_0", "q4_0")],
    (False, False, True, False, False, True, True, True, False), (0, 0, 1, 0, 1, 0, 1, 0, 0))]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gemma", "synth-llama", "synth-gemma3"])
def test_estimates_against_llama_cpp_log(which: str, gemma: Path, synth_pair: list[Path]) -> None:
    """KV: equal to what llama.cpp prints (0.01 MiB). Compute + output: within 5%."""
    path = {"gemma": gemma, "synth-llama": synth_pair[0], "synth-gemma3": synth_pair[1]}[which]
    shape = shape_of(path)
    kv_wrong, compute_wrong = [], []
    for n_ctx, kv, swa_full, n_out in PAIRS if which == "gemma" else GRID:
        cfg = LoadConfig(n_ctx=n_ctx, type_k=kv, type_v=kv, swa_full=swa_full, n_outputs_max=n_out)
        plan = plan_memory(shape, cfg)
        printed, compute, output = _llama_cpp_buffers(path, cfg)
        # One buffer per cache: full-attention first, then sliding-window.
        ours = [sum(kl.k_bytes + kl.v_bytes for kl in plan.kv_layers if kl.swa == swa) for swa in (False, True)]
        ours = [round(b / MiB, 2) for b in ours if b]
        if ours != printed:
            kv_wrong.append((cfg, ours, printed))
        est = (plan.compute_bytes + plan.output_bytes) / MiB
        real = compute + output
        if abs(est - real) > 0.05 * real:
            compute_wrong.append((n_ctx, kv, swa_full, n_out, round(est, 2), real))
    assert not kv_wrong
    assert not compute_wrong


def test_mla_cache_is_the_latent_only(smollm2: Path) -> None:
    """DeepSeek-style MLA: K holds kv_lora_rank + rope dims per cell, one head, no V."""
    from dataclasses import replace

    base = shape_of(smollm2)
    mla = replace(base, mla=True, head_dim_k=512 + 64, head_dim_v=512, n_head_kv=[1] * base.n_layer)
    p = plan_memory(mla, LoadConfig(n_ctx=4096, n_outputs_max=0))
    assert p.kv_cache_bytes == base.n_layer * 4096 * 576 * 2
    assert all(layer.v_bytes == 0 for layer in p.kv_layers)


def test_the_real_models_grid_holds_every_pair_of_settings() -> None:
    """PAIRS covers each pair of values of any two settings of GRID (what a reduced grid must keep)."""
    assert len(PAIRS) == 9 and set(PAIRS) <= set(GRID)
    for a in range(4):
        for b in range(a + 1, 4):
            assert {(r[a], r[b]) for r in PAIRS} == {(r[a], r[b]) for r in GRID}, (a, b)
