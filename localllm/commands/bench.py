"""``localllm bench``: pp and tg throughput, TTFT and ITL for several prompt lengths."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localllm import flags
from localllm.commands._common import load_request, plan_load, say
from localllm.errors import UsageError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.measure.bench import BenchRow, ImageRow

# what a --ctx left out asks for (plan.fitting.measured_ctx decides it)
BENCH_CTX = "what the longest prompt and its reply need"


def register(sub: Subparsers) -> None:
    p = sub.add_parser("bench", help="prefill and decode throughput (llama-bench style); --url measures an OpenAI-compatible server")
    flags.add_model(p, long_flag=False)  # --model names the served model with --url
    p.add_argument("--prompt-tokens", type=flags.int_list, default=None, metavar="N,N", help="prompt lengths (default: 128,512,2048; 128 with --url)")
    p.add_argument("--gen-tokens", type=flags.int_at_least(1, "--gen-tokens"), default=128, metavar="N", help="tokens to generate per run (default: 128)")
    p.add_argument("--reps", type=flags.int_at_least(1, "--reps"), default=3, metavar="N", help="repetitions per prompt length (default: 3)")
    flags.add_vision(p, image=True)  # --image: the vision encoder timed too (a vision model's TTFT has a third phase)
    flags.add_load_options(p, fit=False, ctx_help=f"context size in tokens (default: {BENCH_CTX})")
    u = p.add_argument_group("server options (--url)")
    u.add_argument("--url", default=None, metavar="URL", help="measure this OpenAI-compatible server instead, e.g. http://127.0.0.1:8080/v1")
    u.add_argument("--model", dest="served_model", default=None, metavar="NAME", help="model name to ask for (default: the server's first in /v1/models)")
    u.add_argument("--concurrency", type=flags.int_list, default=[1, 4, 8], metavar="N,N", help="concurrent streaming clients (default: 1,4,8)")
    u.add_argument("--requests", type=flags.int_at_least(1, "--requests"), default=None, metavar="N",
        help="requests per concurrency level (default: 2 x concurrency, at least 4)")
    u.add_argument("--api-key", default=None, metavar="KEY", help="sent as 'Authorization: Bearer KEY' (also: OPENAI_API_KEY)")
    u.add_argument("--timeout", type=flags.nonneg_float, default=300.0, metavar="S", help="seconds per request (default: 300)")
    p.add_argument("--json", action="store_true", help="a JSON list of rows")


@dataclass(frozen=True)
class Options:
    model: str | None
    prompt_tokens: tuple[int, ...]
    gen_tokens: int
    reps: int
    vision: flags.Vision
    load: flags.Load
    url: str | None
    served_model: str | None
    concurrency: list[int]
    requests: int | None
    api_key: str | None
    timeout: float
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, prompt_tokens=tuple(ns.prompt_tokens or ()), gen_tokens=ns.gen_tokens, reps=ns.reps,
                   vision=flags.Vision.from_args(ns), load=flags.Load.from_args(ns), url=ns.url, served_model=ns.served_model,
                   concurrency=list(ns.concurrency), requests=ns.requests, api_key=ns.api_key, timeout=ns.timeout, json=ns.json)


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
    # lazy: the load path, the store and the measurements load gguf and numpy (~0.2 s), which --help (register above) does not need
    from localllm import runtime
    from localllm.measure.bench import run_bench, run_image_bench  # lazy: as above
    from localllm.measure.loadtest import run_url  # lazy: as above
    from localllm.modelfile.model_info import inspect_model  # lazy: as above
    from localllm.plan import fitting  # lazy: as above
    from localllm.store import resolver  # lazy: as above

    opts = Options.from_args(args)
    if opts.url:

        return run_url(opts)
    prompt_tokens = list(opts.prompt_tokens) or [128, 512, 2048]
    path = resolver.resolve(opts.model)
    from localllm.commands import vision_cli  # lazy: only bench --image reads pictures

    images, mmproj = vision_cli.prepare(opts.vision, path, quiet=opts.json, alone=True) if opts.vision.images else ([], None)
    info = inspect_model(path)
    need = max(prompt_tokens) + opts.gen_tokens
    # fitted as run fits (a context the machine cannot hold is shrunk, and said; the check below then names it)
    planned = plan_load(opts.load, load_request(opts.load, flags.NO_LORA, path, opts.load.ctx or fitting.measured_ctx(need), projector=mmproj)).check()
    if planned.fit.outcome is not fitting.Outcome.FITS_AS_ASKED and not opts.json:
        say(f"fitted to this machine: {planned.fit.sentence}")
    with runtime.load(planned) as loaded:
        backend, li = loaded.engine, loaded.info
        if need > li.n_ctx:

            raise UsageError(f"prompt {max(prompt_tokens)} + gen {opts.gen_tokens} tokens exceed --ctx {li.n_ctx}: raise --ctx or drop the longest prompt")
        bos = backend.header.get("tokenizer.ggml.bos_token_id") if backend.header else None
        progress = None if opts.json else (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
        rows = run_bench(
            backend,
            prompt_lengths=prompt_tokens,
            gen_tokens=opts.gen_tokens,
            reps=opts.reps,
            n_vocab=info.n_vocab,
            bos=bos,
            progress=progress,
        )
        image_row = None
        if images:
            assert loaded.projector is not None
            if not opts.json:
                say(f"vision: {vision_cli.describe(loaded.projector)}")
            image_row = run_image_bench(backend, images, gen_tokens=opts.gen_tokens, reps=opts.reps, progress=progress)
    if opts.json:
        fmt.print_json([r.to_dict() for r in rows] + ([image_row.to_dict()] if image_row is not None else []))
    else:
        header = (f"{fmt.safe(info.name)} · {info.file_type} · {fmt.size(info.size_bytes)} · {fmt.count(info.n_params)} params · "
                  f"{li.n_threads} threads · ctx {li.n_ctx} · KV {li.type_k}/{li.type_v}")
        print(table(rows, header) + ("\n" + image_table(image_row) if image_row is not None else ""))
    return 0
