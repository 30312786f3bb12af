"""LoRA adapters (issue 47 item 5): on the engine, in the plan, and on run's command line.

Synthetic adapters (``scripts.synth_gguf.write_lora_gguf``) for the session's
synthetic llama: large enough weights that the greedy output changes."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from localllm.engine_api import LoadConfig
from localllm.errors import InputError
from scripts.synth_gguf import SynthSpec, write_lora_gguf
from tests.helpers.cli import cli


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora")
    return {
        "a": write_lora_gguf(d / "a.gguf"),
        "b": write_lora_gguf(d / "b.gguf", seed=2, targets=("attn_k", "ffn_up")),
        "out": write_lora_gguf(d / "out.gguf", rank=64, output=True, seed=3),
        "embd32": write_lora_gguf(d / "embd32.gguf", SynthSpec(n_embd=32)),
        "qwen2": write_lora_gguf(d / "qwen2.gguf", SynthSpec(arch="qwen2")),
    }


def test_adapter_changes_logits_clearing_restores_them_and_scale_0_is_none(synth_model: Path, adapters: dict[str, Path]) -> None:
    from localllm.engine import LlamaCppBackend
    from localllm.engine.lora import AdapterSpec

    with LlamaCppBackend() as be:
        be.load(synth_model, LoadConfig(n_ctx=256, n_outputs_max=0))
        toks = be.tokenize("hello world")
        base = be.logits(toks).copy()
        assert be.load_adapters([AdapterSpec(adapters["a"])]) == [adapters["a"]]
        with_a = be.logits(toks).copy()
        assert np.abs(with_a - base).max() > 0.1  # the adapter is applied
        be.set_adapter_scales([0.5])
        half = be.logits(toks).copy()
        assert not np.array_equal(half, with_a) and not np.array_equal(half, base)
        be.set_adapter_scales([0.0])
        assert np.array_equal(be.logits(toks), base)  # scale 0 is exactly no adapter
        be.set_adapter_scales([1.0])
        assert np.array_equal(be.logits(toks), with_a)
        be.load_adapters([AdapterSpec(adapters["a"]), AdapterSpec(adapters["b"], 0.0)])
        assert np.array_equal(be.logits(toks), with_a)  # b at 0: a alone
        assert be.adapters == [(adapters["a"], 1.0), (adapters["b"], 0.0)]
        be.load_adapters([])
        assert np.array_equal(be.logits(toks), base)  # cleared: exactly the base model again


def test_mismatched_or_damaged_adapter_is_one_line_before_llama_cpp(synth_model: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    from localllm.engine import LlamaCppBackend
    from localllm.engine.lora import AdapterSpec

    raw = adapters["a"].read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(raw[:-64])
    (tmp_path / "text.gguf").write_text("not a gguf at all, just text\n" * 4)
    half = gguf.GGUFWriter(str(tmp_path / "half.gguf"), "llama")  # a lora_a without its lora_b
    half.add_type("adapter")
    half.add_string("adapter.type", "lora")
    half.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 64), dtype=np.float32))
    half.write_header_to_file()
    half.write_kv_data_to_file()
    half.write_tensors_to_file()
    half.close()
    cases = {
        adapters["qwen2"]: ["architecture 'qwen2'", "is 'llama'", "qwen2.gguf", synth_model.name],
        adapters["embd32"]: ["embedding size of 32", "has 64", "embd32.gguf", synth_model.name],
        tmp_path / "truncated.gguf": ["truncated"],
        tmp_path / "text.gguf": ["not a GGUF file"],
        tmp_path / "half.gguf": ["lora_a but no lora_b"],
        synth_model: ["not a LoRA adapter", "give it as the model"],
        tmp_path / "missing.gguf": ["LoRA adapter not found"],
    }
    with LlamaCppBackend() as be:
        be.load(synth_model, LoadConfig(n_ctx=256))
        for path, words in cases.items():
            with pytest.raises(InputError) as err:
                be.load_adapters([AdapterSpec(path)])
            msg = str(err.value)
            assert "\n" not in msg and all(w in msg for w in words), msg
            assert "LoRA arch mismatch" not in msg  # ours, not llama.cpp's "model arch and LoRA arch mismatch"
        assert be.adapters == []  # nothing half-loaded
    r = cli("run", str(synth_model), "-p", "hi", "-n", "2", "--lora", str(adapters["embd32"]), "--no-stats")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "embedding size of 32" in r.stderr, r.stderr


def test_plan_counts_each_adapter_on_its_layers_device(synth_model: Path, adapters: dict[str, Path]) -> None:
    """An adapter's pair sits on the base tensor's buffer (src/llama-adapter.cpp):
    layer 1 and the output on the GPU with --ngl 2 of 2 layers + output, layer 0 on the CPU."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.modelfile.lora import read_adapter
    from localllm.plan import planner

    a, out = read_adapter(adapters["a"]), read_adapter(adapters["out"])
    shape = planner.ModelShape.from_header(read_header(synth_model))
    p = planner.plan_memory(shape.with_adapters([a, out]), LoadConfig(n_ctx=256, n_gpu_layers=2), gpu=True)
    base = planner.plan_memory(shape, LoadConfig(n_ctx=256, n_gpu_layers=2), gpu=True)
    by = {**{f"a:{k}": v for k, v in a.bytes_by_base().items()}, **{f"o:{k}": v for k, v in out.bytes_by_base().items()}}
    gpu = sum(v for k, v in by.items() if k.split(":")[1].startswith(("blk.1.", "output")))
    assert (p.lora_gpu_bytes, p.lora_cpu_bytes) == (gpu, a.n_bytes + out.n_bytes - gpu) and gpu > 0
    assert p.weights_gpu_bytes - base.weights_gpu_bytes == p.lora_gpu_bytes
    assert p.total_cpu_bytes - base.total_cpu_bytes == p.lora_cpu_bytes
    # plan --lora: the text's row and --json's figures are the same plan
    args = ("plan", str(synth_model), "--lora", f"{adapters['a']},{adapters['out']}", "--vram", "1GiB", "--ngl", "2", "--ctx", "256", "--no-dry-run")
    j = json.loads(cli(*args, "--json").stdout)
    assert (j["lora_gpu_bytes"], j["lora_cpu_bytes"]) == (p.lora_gpu_bytes, p.lora_cpu_bytes)
    text = cli(*args).stdout
    assert "of which LoRA" in text


def test_llama_cpp_allocates_what_the_plan_counts(synth_model: Path, adapters: dict[str, Path]) -> None:
    """llama.cpp's 'LoRA buffer size' line (MiB, two decimals) against the adapter's bytes."""
    from localllm.engine import ROUTER, LlamaCppBackend
    from localllm.engine.lora import AdapterSpec
    from localllm.modelfile.lora import read_adapter

    with LlamaCppBackend() as be:
        be.load(synth_model, LoadConfig(n_ctx=256))
        mark = ROUTER.mark()
        be.load_adapters([AdapterSpec(adapters["out"])])
        logged = [line for _, line in ROUTER.lines_since(mark) if "LoRA buffer size" in line]
    mib = sum(float(line.split("=")[1].split()[0]) for line in logged)
    assert logged and abs(mib - read_adapter(adapters["out"]).n_bytes / 2**20) <= 0.006, logged


def test_run_lora_flags(synth_model: Path, adapters: dict[str, Path]) -> None:
    def text(*extra: str) -> str:
        r = cli("run", str(synth_model), "-p", "hello", "--raw", "--temp", "0", "-n", "8", "--ctx", "256", "--json", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["text"]

    plain, with_a = text(), text("--lora", str(adapters["a"]))
    r = cli("run", str(synth_model), "-p", "hi", "--raw", "-n", "2", "--ctx", "256", "--json", "--lora-scaled", f"{adapters['a']}:0.5,{adapters['b']}:2")
    assert json.loads(r.stdout)["lora"] == [{"id": 0, "path": str(adapters["a"]), "scale": 0.5}, {"id": 1, "path": str(adapters["b"]), "scale": 2.0}]
    assert with_a != plain
    assert text("--lora-scaled", f"{adapters['a']}:1.0") == with_a
    assert text("--lora", str(adapters["a"]), "--lora-init-without-apply") == plain
    bad = cli("run", str(synth_model), "-p", "hi", "--lora-scaled", f"{adapters['a']}:x")
    assert bad.returncode == 2 and "--lora-scaled" in bad.stderr
    alone = cli("run", str(synth_model), "-p", "hi", "--lora-init-without-apply")
    assert alone.returncode == 2 and "needs --lora" in alone.stderr


def test_cockpit_lora_flags_reach_its_settings_and_fit(synth_model: Path, adapters: dict[str, Path]) -> None:
    """``localllm tui --lora``: the settings carry the adapters (a reload field), the fit
    checks and counts them, and the engine thread loads them (``Settings.adapter_specs``)."""
    from localllm.cli import build_parser
    from localllm.modelfile.lora import AdapterSpec
    from localllm.tui.cli import settings_from_args
    from localllm.tui.settings import RELOAD_FIELDS

    args = build_parser().parse_args(["tui", str(synth_model), "--lora", str(adapters["a"]), "--lora-scaled", f"{adapters['b']}:0.25"])
    s = settings_from_args(args)
    assert s.lora == ((str(adapters["a"]), 1.0), (str(adapters["b"]), 0.25)) and "lora" in RELOAD_FIELDS
    assert s.adapter_specs() == [AdapterSpec(adapters["a"], 1.0), AdapterSpec(adapters["b"], 0.25)]
    assert [a.path for a in s.fit_request().adapters] == [adapters["a"], adapters["b"]]
    off = settings_from_args(build_parser().parse_args(["tui", "--lora", str(adapters["a"]), "--lora-init-without-apply"]))
    assert off.lora == ((str(adapters["a"]), 0.0),)
    r = cli("tui", "--lora", str(synth_model.with_name("missing.gguf")))  # one line, before the cockpit opens
    assert r.returncode == 1 and "LoRA adapter not found" in r.stderr and r.stderr.strip().count("\n") == 0
