"""The llama.cpp engine: real generation, and timings that agree with llama.cpp's perf counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli

GREEDY = SamplingConfig(temperature=0.0)


def _agree(ours: float, theirs: float) -> bool:
    """The issue's bar: within 5% or 2 ms."""
    return abs(ours - theirs) <= max(0.05 * theirs, 2.0)


def test_stream_stamps_and_counts(synth_model: Path) -> None:
    with LlamaCppBackend() as b:
        info = b.load(synth_model, LoadConfig(n_ctx=256, n_batch=32))
        assert info.n_ctx == 256 and info.load_ms > 0
        gen = b.stream("the cat sat on the mat", SamplingConfig(temperature=0, max_tokens=20, ignore_eos=True), chat=False)
        events = list(gen)
        s = gen.stats
    assert [e.index for e in events] == list(range(20))
    stamps = [e.t_ns for e in events]
    assert stamps == sorted(stamps) and len(set(stamps)) == 20
    assert s is not None and s.generated_tokens == 20 and s.decode_evals == 19 and s.stop_reason == "length"
    assert s.prompt_tokens == 7  # BOS + six words of the test vocabulary
    assert s.ttft_ms >= s.prefill_ms > 0
    assert s.itl_ms.p50 <= s.itl_ms.p95 <= s.itl_ms.max
    assert s.tpot_ms == pytest.approx((stamps[-1] - stamps[0]) / 1e6 / 19)


def test_prompt_chunks_never_leave_one_token(synth_model: Path) -> None:
    """A 33-token prompt with n_batch 32 must count as 33 prompt tokens in llama.cpp too."""
    with LlamaCppBackend() as b:
        b.load(synth_model, LoadConfig(n_ctx=128, n_batch=32, n_ubatch=32))
        for _ in b.stream(list(range(3, 36)), SamplingConfig(temperature=0, max_tokens=3, ignore_eos=True)):
            pass
        perf = b.perf_counters()
    assert perf["n_p_eval"] == 33 and perf["n_eval"] == 2


def test_context_fills_up(synth_model: Path) -> None:
    with LlamaCppBackend() as b:
        info = b.load(synth_model, LoadConfig(n_ctx=32))
        assert info.n_ctx >= 32  # llama.cpp pads the context (to 256 cells)
        s = b.stream(list(range(3, 23)), SamplingConfig(temperature=0, ignore_eos=True)).drain()
        # The cache fills (n_ctx tokens), and the token sampled from the last position is emitted too.
        assert s.generated_tokens == info.n_ctx - 20 + 1 and s.stop_reason == "context"
        assert s.context_used == info.n_ctx == len(b.cache_tokens) and s.context_shifts == []


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_kv_cache_runs(tmp_path: Path, kv: str) -> None:
    model = write_llama_gguf(tmp_path / "hd32.gguf", SynthSpec(n_embd=128, n_head=4, n_head_kv=2))
    with LlamaCppBackend() as b:
        b.load(model, LoadConfig(n_ctx=128, type_k=kv, type_v=kv))
        out = list(b.stream("hello world", SamplingConfig(temperature=0, max_tokens=5, ignore_eos=True), chat=False))
    assert len(out) == 5


@pytest.mark.slow
def test_cache_type_that_cannot_divide_head_dim(synth_model: Path) -> None:
    """Head dim 16 cannot hold q8_0 blocks of 32: a usage error before llama.cpp is called."""
    proc = cli("run", str(synth_model), "-p", "hi", "--kv-type", "q8_0")
    assert proc.returncode == 2 and "head dim is 16: use --kv-type f16" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_seeded_sampling_repeats(synth_model: Path) -> None:
    texts = []
    for _ in range(2):
        with LlamaCppBackend() as b:
            b.load(synth_model, LoadConfig(n_ctx=128))
            texts.append("".join(e.text for e in b.stream("the dog", SamplingConfig(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True), chat=False)))
    assert texts[0] == texts[1] and texts[0]


@pytest.mark.slow
@pytest.mark.parametrize("n_batch", [512, 64])
def test_timings_agree_with_llama_perf_counters(smollm2: Path, n_batch: int) -> None:
    prompt = "Explain, step by step, why the sky is blue, and what a KV cache is. " * 12
    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=2048, n_batch=n_batch, n_ubatch=n_batch))
        s = b.stream(prompt, SamplingConfig(temperature=0, max_tokens=48, ignore_eos=True)).drain()
        perf = b.perf_counters()
    assert s is not None
    # the prompt (~170 tokens) fills several 64-token batches, or one 512-token batch
    assert perf["n_p_eval"] == s.prompt_tokens and 128 < s.prompt_tokens < 512
    assert perf["n_eval"] == s.decode_evals == 47
    assert _agree(s.prefill_ms, perf["t_p_eval_ms"]), (s.prefill_ms, perf)
    assert _agree(s.decode_ms, perf["t_eval_ms"]), (s.decode_ms, perf)
    # TTFT is prefill plus the first sample; the ITL gaps hold the decodes.
    assert s.prefill_ms <= s.ttft_ms <= s.prefill_ms + 50
    gaps_total = s.tpot_ms * (s.generated_tokens - 1)
    assert s.decode_ms <= gaps_total + 0.5


@pytest.mark.slow
def test_paris(smollm2: Path) -> None:
    proc = cli("run", "-p", "What is the capital of France? Answer in one word.", "--temp", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    for label in ("load duration", "prompt eval rate", "eval rate", "time to first token", "inter-token latency"):
        assert label in proc.stderr


@pytest.mark.slow
def test_run_json_and_stdin(smollm2: Path) -> None:
    proc = cli("run", "--json", "-n", "8", "--temp", "0", stdin="What is the capital of France? Answer in one word.")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # llama.cpp's log goes to logging, not to fd 2
    d = json.loads(proc.stdout)
    for key in ("ttft_ms", "tpot_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "prompt_tokens", "generated_tokens", "load_ms", "text"):
        assert key in d
    assert set(d["itl_ms"]) == {"p50", "p95", "max"}
    assert "Paris" in d["text"] and 0 < d["generated_tokens"] <= 8


@pytest.mark.slow
def test_gemma_completes_text(gemma: Path) -> None:
    proc = cli("run", str(gemma), "--raw", "-p", "The capital of France is", "-n", "12", "--temp", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["generated_tokens"] == 12 and "France" in d["text"]


def test_an_rpc_build_without_a_gpu_reports_no_gpu_offload() -> None:
    """Our builds carry llama.cpp's RPC backend, which makes
    llama_supports_gpu_offload() true on every machine; a CPU machine must still
    be told it has no GPU (or doctor tells it to offload layers)."""
    import llama_cpp

    from localllm.engine import gpu_offload_supported, system_info

    info = system_info().upper()
    has_gpu_backend = any(k in info for k in ("CUDA", "METAL", "VULKAN", "HIP", "SYCL"))
    assert llama_cpp.llama_supports_rpc()  # scripts/install.sh builds it in
    # A GPU build offloads (its device is there); an RPC-only CPU build does not.
    assert gpu_offload_supported() is has_gpu_backend
