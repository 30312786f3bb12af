"""``localllm run``: stream a reply, then the timings that tell slow-to-start from slow-to-stream."""

from __future__ import annotations

import argparse
import sys

from localllm import catalog, fmt
from localllm.backend import SamplingConfig
from localllm.commands._common import fit_config, say
from localllm.errors import InputError, UsageError
from localllm.metrics import GenerationStats


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        prompt = args.prompt
    elif sys.stdin is not None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    else:
        raise UsageError("no prompt: pass -p TEXT or pipe text on stdin")
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass -p TEXT or pipe text on stdin")
    return prompt


def stats_block(s: GenerationStats) -> str:
    rows = [
        ("load duration", fmt.ms(s.load_ms)),
        ("prompt eval count", f"{s.prompt_tokens} token(s)"),
        ("prompt eval duration", fmt.ms(s.prefill_ms)),
        ("prompt eval rate", f"{s.prefill_tokens_per_s:.2f} tokens/s"),
        ("eval count", f"{s.generated_tokens} token(s)"),
        ("eval duration", fmt.ms(s.decode_ms)),
        ("eval rate", f"{s.decode_tokens_per_s:.2f} tokens/s"),
        ("time to first token", fmt.ms(s.ttft_ms)),
        ("inter-token latency", f"p50 {fmt.ms(s.itl_ms.p50)}, p95 {fmt.ms(s.itl_ms.p95)}, max {fmt.ms(s.itl_ms.max)}"),
        ("total duration", fmt.ms(s.total_ms)),
    ]
    return "\n".join(f"{k + ':':<22}{v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
    path = catalog.resolve(args.model)
    from localllm.engine import LlamaCppBackend  # lazy: loads llama.cpp

    sampling = SamplingConfig(temperature=args.temp, seed=args.seed, max_tokens=args.n_predict)
    fitted = fit_config(args, path, args.ctx)
    if not fitted.fit.fits:
        raise InputError(f"does not fit: {fitted.fit.reason}")
    if fitted.fit.steps or args.vram is not None:
        c = fitted.config
        say(f"fitted to {'--vram ' + fmt.size(args.vram) if args.vram else 'this machine'}: context {c.n_ctx}, KV {c.type_k}/{c.type_v}, "
            f"{fitted.fit.plan.n_gpu_layers} layers on the GPU ({fitted.fit.reason})")
    with LlamaCppBackend() as backend:
        backend.load(path, fitted.config)
        pieces: list[str] = []
        for event in backend.stream(prompt, sampling, chat=not args.raw):
            pieces.append(event.text)
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        stats = backend.last_stats
        assert stats is not None
        if args.json:
            out = {"model": str(path), "text": "".join(pieces), **stats.to_dict()}
            fmt.print_json(out)
            return 0
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.no_stats:
            print("\n" + stats_block(stats), file=sys.stderr)
    return 0
