"""``localllm bench``: pp and tg throughput, TTFT and ITL for several prompt lengths."""

from __future__ import annotations

import argparse
import sys

from localllm import runtime
from localllm.commands._common import load_request, plan_load, say
from localllm.errors import UsageError
from localllm.measure.bench import BenchRow, ImageRow, run_bench, run_image_bench
from localllm.measure.loadtest import run_url
from localllm.modelfile.model_info import inspect_model
from localllm.plan import fitting
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


def image_table(r: ImageRow) -> str:
    return "\n".join([
        "", "| images | prompt | encode | images/s | prefill | TTFT | tg t/s |", "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r.images} | {r.prompt_tokens} | {fmt.mean_pm(r.encode_ms, r.encode_std)} ms | "
        f"{f'{r.images_per_s:.2f}' if r.images_per_s is not None else 'n/a'} | {fmt.ms(r.prefill_ms)} | {fmt.ms(r.ttft_ms)} | "
        f"{f'{r.tg_tokens_per_s:.1f}' if r.tg_tokens_per_s is not None else 'n/a'} |",
    ])


def run(args: argparse.Namespace) -> int:
    if args.url:

        return run_url(args)
    args.prompt_tokens = args.prompt_tokens or [128, 512, 2048]
    path = resolver.resolve(args.model)
    from localllm.commands import vision_cli  # lazy: only bench --image reads pictures

    images, mmproj = vision_cli.prepare(args, path) if args.image else ([], None)
    info = inspect_model(path)
    need = max(args.prompt_tokens) + args.gen_tokens
    # fitted as run fits (a context the machine cannot hold is shrunk, and said; the check below then names it)
    planned = plan_load(args, load_request(args, path, args.ctx or fitting.measured_ctx(need), projector=mmproj)).check()
    if planned.fit.outcome is not fitting.Outcome.FITS_AS_ASKED and not args.json:
        say(f"fitted to this machine: {planned.fit.sentence}")
    with runtime.load(planned) as loaded:
        backend, li = loaded.engine, loaded.info
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
        image_row = None
        if images:
            assert loaded.projector is not None
            if not args.json:
                say(f"vision: {vision_cli.describe(loaded.projector)}")
            image_row = run_image_bench(backend, images, gen_tokens=args.gen_tokens, reps=args.reps, progress=progress)
    if args.json:
        fmt.print_json([r.to_dict() for r in rows] + ([image_row.to_dict()] if image_row is not None else []))
    else:
        header = (f"{fmt.safe(info.name)} · {info.file_type} · {fmt.size(info.size_bytes)} · {fmt.count(info.n_params)} params · "
                  f"{li.n_threads} threads · ctx {li.n_ctx} · KV {li.type_k}/{li.type_v}")
        print(table(rows, header) + ("\n" + image_table(image_row) if image_row is not None else ""))
    return 0
