"""Every benchmark in scripts/ runs in its quick mode here, so none can rot.

A quick mode is one repetition with few tokens: the figures are noise, so the
tests check that the script completes and prints the figures it exists for
(the line each user reads), not the targets. Two of these scripts had rotted
before this file existed (plan_conformance could not import ``scripts``; bench_rpc
crashed formatting a spread that one repetition does not have). A spread from
one repetition prints n/a, never a made-up 0.

bench_tui, soak_chat and quality_vs_llama have their own tests (tests/tui/test_terminal.py,
tests/benchmarks/test_soak_chat.py, tests/measure/test_quality_vs_llama.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

# script and arguments -> patterns its output must contain
QUICK = {
    "bench_rpc": (
        ["--quick"],
        [r"local CPU only\s+[\d.]+ ±n/a\s+[\d.]+", r"one loopback worker \(all layers\)\s+[\d.]+", r"split across two workers\s+[\d.]+",
         r"per decoded token [\d,]+ B sent"],
    ),
    "bench_moe": (
        ["--quick"],
        [r"local only\s+[\d.]+\s+[\d.]+", r"localllm: experts in RAM \(--n-cpu-moe 4\), rest on the worker\s+[\d.]+\s+[\d.]+",
         r"llama-bench -rpc -ngl 99 -ncmoe 4\s+[\d.]+\s+[\d.]+", r"decode, localllm / llama-bench with the same placement \(target >= 0.95\): [\d.]+"],
    ),
    "bench_serve": (
        ["--quick"],
        [r"\| localllm serve \| 1 \| \d+ \| 0 \| [\d.]+", r"\| localllm serve \| 4 \| \d+ \| 0 \| [\d.]+", r"4 clients / 1 client \(target >= 2.5\): [\d.]+",
         r"grammar-constrained / unconstrained decode rate .*: [\d.]+ \[pairs: [\d.]+\]"],
    ),
    "bench_embed": (
        ["--quick"],
        [r"\| localllm serve \| 1 \| 8 \| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|",
         r"localllm serve / llama-server at 1 client\(s\) \(target >= 0.9\): n/a \(llama-server not run \(--quick\)\)"],
    ),
    "bench_agents": (
        ["--quick", "--threads", "1"],
        [r"\| /v1/messages \| 1 \| \d+ \| [\d.]+ \|", r"\| /v1/responses \| 1 \| \d+ \| [\d.]+ \|",
         r"/v1/messages / /v1/chat/completions, decode tok/s at 1 client\(s\) \(target >= 0.97\): [\d.]+",
         r"/v1/responses / /v1/chat/completions, decode tok/s at 1 client\(s\) \(target >= 0.97\): [\d.]+"],
    ),
    "bench_claude_code": (
        ["--quick", "--threads", "1"],
        [r"\| serve \| [\d.]+ \| [\d.]+ \| [\d.]+ \|",
         r"first-request TTFT speed, serve / llama-server \(target >= 0.95\): n/a \(llama-server not run \(--quick\)\)",
         r"serve's second request / its first \(prompt cache; target <= 0.1\): [\d.]+"],
    ),
    "bench_rerank": (
        ["--quick"],
        [r"\| localllm serve \| 1 \| 64 \| \d+ \| [\d.]+ \| [\d.]+ \|",
         r"rerank throughput \(documents/s\), localllm serve / llama-server at 1 client\(s\) \(target >= 0.9\): (?:[\d.]+|n/a)"],
    ),
    "plan_conformance": (
        ["--quick"],
        [r"KV \(and recurrent state\) exact to the printed MiB: (\d+)/\1", r"dry run's compute = the real load's: (\d+)/\1",
         r"compute, estimate: (\d+) loads, at or above 0.90 of llama.cpp in \1"],
    ),
    "bench_contention": (
        ["--quick"],
        [r"idle: localllm adaptive / llama-bench at the best fixed count .*\(target >= 0.97\): (?:[\d.]+|n/a)",
         r"one core busy: localllm adaptive / llama-bench at its default threads \(target >= 1.4\): (?:[\d.]+|n/a)",
         r"hog on and off: localllm adaptive / llama-bench at the best fixed count .*\(target >= 0.97\): (?:[\d.]+|n/a)",
         r"one core busy: serve adaptive / llama-server default threads, 8 client\(s\) \(target >= 1.3\): (?:[\d.]+|n/a)"],
    ),
    "bench_context_shift": (
        ["--quick"],
        [r"shift in place \(incl\. the next decode\):\s+[\d.]+ ms", r"re-process the kept window:\s+[\d.]+ ms", r"ratio [\d.]+",
         r"f16\s+[\d.]+ t/s", r"q8_0\s+[\d.]+ t/s", r"q4_0\s+[\d.]+ t/s"],
    ),
    "bench_compact": (
        ["--quick", "--threads", "1"],
        [r"sliding window: recall \d+/2 · tokens kept \d+ · shifts \d+", r"compaction: recall \d+/2 · tokens kept \d+",
         r"time per compaction, median: (?:[\d.]+ s|n/a \(none ran\))",
         r"recall of planted facts: sliding window \d+/2, compaction \d+/2 \(ceiling \d+/2\)"],
    ),
    "bench_prefix_cache": (
        ["--quick"],
        [r"cold\s+[\d.]+ ms", r"warm \(same chat\)\s+[\d.]+ ms", r"warm \(state on disk\)\s+[\d.]+ ms"],
    ),
    "bench_resume": (
        ["--quick", "--threads", "1"],
        [r"re-read\s+first reply TTFT\s+[\d.]+ ms", r"kept state\s+first reply TTFT\s+[\d.]+ ms  \(state load [\d.]+ ms, file [\d.]+ MiB\)",
         r"kept / re-read TTFT \(target <= 0.15\): [\d.]+", r"same first reply \(greedy\) as the conversation going on: yes"],
    ),
    "bench_speculative": (
        ["--quick"],
        [r"none\s+[\d.]+", r"auto\s+[\d.]+", r"auto/none\s+x[\d.]+", r"llama-server\s+not run \(--quick\)",
         r"index: Claude Code's request, [\d,]+ tokens, indexed for drafting in [\d.]+ ms"],
    ),
    "bench_vs_lowlevel": (
        ["--quick", "--threads", "1"],
        [r"pp64 \|\s+[\d.]+ ±\s+n/a \|\s+[\d.]+ ±\s+n/a \| [\d.]+", r"tg16@64 \|\s+[\d.]+ ±\s+n/a"],
    ),
    "kv_cache_quality": (
        ["--quick"],
        [r"f16 cache perplexity [\d.]+ on \d+ scored tokens", r"q8_0\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+%", r"q4_0\s+[\d.]+\s+[\d.]+"],
    ),
    "bench_pull": (
        ["--quick"],
        [r"localllm pull\s+\d+ ms\s+[\d.]+ MB/s", r"hf_hub_download\s+\d+ ms", r"ratio localllm/huggingface_hub: [\d.]+"],
    ),
    "bench_router": (
        ["--quick"],
        [r"switch \(last token of A -> first token of B\), median: localllm \d+ ms, llama-server \d+ ms",
         r"switch localllm/llama-server: [\d.]+ \[.*\] \(target <= 1.1\) \(not judged\)",
         r"decode router/serve smollm2: [\d.]+ \[.*\] \(target >= 0.97\) \(not judged\)",
         r"decode router/serve gemma3-270m: [\d.]+ \[.*\] \(target >= 0.97\) \(not judged\)"],
    ),
    "hostile_requests": (
        ["--quick"],
        [r"PASS slowloris: 511 half-sent", r"PASS SIGTERM then SIGINT mid-stream", r"hostile requests: (\d+)/\1 passed"],
    ),
    "bench_audio": (
        ["--quick"],
        [r"encode per second of audio, 64-wide 1-block encoder, 10 s clip, 2 thread\(s\), median of 1: localllm [\d.]+ ms, llama-mtmd-cli [\d.]+ ms",
         r"TTFT, .*: localllm \d+ ms, llama-mtmd-cli \d+ ms", r"TTFT speed, llama-mtmd-cli / localllm \(target >= 0.95\): [\d.]+",
         r"second turn TTFT / first turn's \(audio kept in the cache\): [\d.]+"],
    ),
    "bench_vision": (
        ["--quick"],
        [r"encode, large projector, 1 thread\(s\), median of 1: localllm \d+ ms, llama-mtmd-cli \d+ ms, ratio [\d.]+x",
         r"second turn TTFT / first turn's \(image kept in the cache\): [\d.]+"],
    ),
    "bench_tools": (
        ["--quick", "--threads", "1"],
        [r"\| question \| [\d.]+ \| \d+ \(\d+\) \| [\d.]+ \| \d+ \(\d+\) \|",
         r"tool round trip's extra TTFT \(question \+ result\) against the same turns without tools: [+-][\d.]+ ms",
         r"round trip: evaluated \d+ new tokens of \d+ \(cache_n \d+\); history re-prefilled: 0 of the first request's \d+ tokens"],
    ),
    "bench_forecast": (
        ["--quick"],
        [r"forecast / measured TTFT at 32 tokens: [\d.]+", r"forecast / measured TTFT at 128 tokens: [\d.]+",
         r"median forecast / measured TTFT over 6 runs \(target 0.75-1.25\): [\d.]+"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(QUICK))
def test_benchmark_quick_mode_completes_and_prints_its_figures(script: str) -> None:
    args, patterns = QUICK[script]
    r = subprocess.run([sys.executable, f"scripts/{script}.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    for pattern in patterns:
        assert re.search(pattern, r.stdout), f"{script}: no line matching {pattern!r} in\n{r.stdout[-3000:]}"


def test_every_benchmark_has_a_quick_mode_that_a_test_runs() -> None:
    """A new scripts/bench_*.py without a quick-mode test fails here."""
    covered = set(QUICK) | {"bench_tui", "soak_chat", "quality_vs_llama"}  # tested in their own files
    benches = {p.stem for p in (REPO / "scripts").glob("bench_*.py")}
    benches |= {"plan_conformance", "quality_vs_llama", "kv_cache_quality", "soak_chat"}
    missing = sorted(benches - covered)
    assert not missing, f"benchmarks without a quick-mode test: {missing}"

