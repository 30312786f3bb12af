"""``localllm bench``: pp and tg throughput, TTFT and ITL for several prompt lengths."""

from __future__ import annotations

import argparse
import sys

from localllm.commands._common import load_config
from localllm.errors import UsageError
from localllm.measure.bench import BenchRow, run_bench
from localllm.measure.loadtest import run_url
from localllm.modelfile.model_info import inspect_model
from localllm.store import resolver
from localllm.util import fmt


def table(rows: list[BenchRow], header: str) -> str:
    lines = [header, "", "| prompt | gen | pp t/s | tg t/s | TTFT | ITL p50 | ITL p95 |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r.prompt_tokens} | {r.gen_tokens} | {fmt.mean_pm(r.pp_tokens_per_s, r.pp_std)} | "
            f"{fmt.mean_pm(r.tg_tokens_per_s, r.tg_std)} | {fmt.ms(r.ttft_ms)} | {fmt.ms(r.itl_p50_ms)} | {fmt.ms(r.itl_p95_ms)} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.url:

        return run_url(args)
    args.prompt_tokens = args.prompt_tokens or [128, 512, 2048]
    path = resolver.resolve(args.model)
    info = inspect_model(path)
    need = max(args.prompt_tokens) + args.gen_tokens
    n_ctx = args.ctx or (need + 255) // 256 * 256
    from localllm.engine import LlamaCppBackend  # lazy: loads llama.cpp

    with LlamaCppBackend() as backend:
        li = backend.load(path, load_config(args, n_ctx))
        if need > li.n_ctx:

            raise UsageError(f"prompt {max(args.prompt_tokens)} + gen {args.gen_tokens} tokens exceed --ctx {li.n_ctx}: raise --ctx or drop the longest prompt")
        bos = backend.header.get("tokenizer.ggml.bos_token_id") if backend.header else None
        progress = None if args.json else (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
        rows = run_bench(
            backend,
            prompt_lengths=args.prompt_tokens,
            gen_tokens=args.gen_tokens,
            reps=args.reps,
            n_vocab=info.n_vocab,
            bos=bos,
            progress=progress,
        )
    if args.json:
        fmt.print_json([r.to_dict() for r in rows])
    else:
        header = (f"{fmt.safe(info.name)} · {info.file_type} · {fmt.size(info.size_bytes)} · {fmt.count(info.n_params)} params · "
                  f"{li.n_threads} threads · ctx {li.n_ctx} · KV {li.type_k}/{li.type_v}")
        print(table(rows, header))
    return 0
