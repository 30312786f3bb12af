"""``localllm bench``: prefill and decode throughput the way llama-bench reports it.

For each prompt length: a prompt of random token ids (as llama-bench builds
them, seeded), then ``gen_tokens`` greedy tokens past end-of-generation. pp t/s
is prompt tokens over llama.cpp's prompt-evaluation time, tg t/s is
single-token evaluations over their time; both as mean ± sample stddev over
``reps`` runs, after one warm-up run.

With images (``bench --image``, a vision model): TTFT's third phase, the
vision encoder, timed on its own (``encode_ms``, images per second) beside the
prefill that reads the images' embeddings and the prompt; each repetition
encodes the pictures again (``Projector.forget``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from localllm.engine_api import Engine, SamplingConfig
from localllm.engine_api.stats import mean_std, percentile


@dataclass
class BenchRow:
    prompt_tokens: int
    gen_tokens: int
    reps: int
    pp_tokens_per_s: float | None
    pp_std: float | None  # None with one repetition: a spread needs two
    tg_tokens_per_s: float | None  # None with --gen-tokens 1: no single-token evaluation
    tg_std: float | None
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ImageRow:
    images: int
    prompt_tokens: int  # the images' tokens included
    gen_tokens: int
    reps: int
    encode_ms: float | None
    encode_std: float | None
    images_per_s: float | None
    prefill_ms: float | None
    ttft_ms: float | None
    tg_tokens_per_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"case": "image", **asdict(self)}


def run_image_bench(backend: Any, images: Sequence[Any], *, gen_tokens: int, reps: int,
                    progress: Callable[[str], None] | None = None) -> ImageRow:
    """``reps`` runs of a short question after ``images`` (a warm-up first), each encoding them anew."""
    sampling = SamplingConfig(temperature=0.0, max_tokens=gen_tokens, ignore_eos=True)
    stats = []
    for r in range(reps + 1):
        if progress:
            progress("image warm-up" if r == 0 else f"{len(images)} image(s) tg{gen_tokens} rep {r}/{reps}")
        backend.projector.forget()
        with backend.stream_images("Describe the picture.", list(images), sampling, chat=False) as gen:
            for _ in gen:
                pass
        if r:
            stats.append(gen.stats)
    enc = [s.encode_ms for s in stats if s.encode_ms is not None]
    enc_m, enc_s = mean_std(enc) if enc else (None, None)
    ips = [s.images_per_s for s in stats if s.images_per_s is not None]
    tg = [s.decode_tokens_per_s for s in stats if s.decode_tokens_per_s is not None]
    return ImageRow(images=len(images), prompt_tokens=stats[-1].prompt_tokens, gen_tokens=gen_tokens, reps=reps, encode_ms=enc_m,
                    encode_std=enc_s, images_per_s=mean_std(ips)[0] if ips else None,
                    prefill_ms=mean_std([s.prefill_ms for s in stats])[0], ttft_ms=mean_std([s.ttft_ms for s in stats if s.ttft_ms is not None])[0],
                    tg_tokens_per_s=mean_std(tg)[0] if tg else None)


def random_prompt(n_tokens: int, n_vocab: int, bos: int | None, seed: int) -> list[int]:
    rng = random.Random(seed)
    toks = [rng.randrange(n_vocab) for _ in range(n_tokens)]
    if bos is not None and toks:
        toks[0] = bos
    return toks


def _one(backend: Engine, prompt: Sequence[int], gen_tokens: int):
    return backend.stream(prompt, SamplingConfig(temperature=0.0, max_tokens=gen_tokens, ignore_eos=True)).drain()


def run_bench(
    backend: Engine,
    *,
    prompt_lengths: Sequence[int],
    gen_tokens: int,
    reps: int,
    n_vocab: int,
    bos: int | None,
    seed: int = 42,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    if progress:
        progress("warm-up")
    _one(backend, random_prompt(min(prompt_lengths[0], 64), n_vocab, bos, seed), min(gen_tokens, 8))
    rows = []
    for p in prompt_lengths:
        pp: list[float] = []
        tg: list[float] = []
        ttft: list[float] = []
        gaps: list[float] = []
        for r in range(reps):
            if progress:
                progress(f"pp{p} tg{gen_tokens} rep {r + 1}/{reps}")
            s = _one(backend, random_prompt(p, n_vocab, bos, seed + r), gen_tokens)
            pp.append(s.prefill_tokens_per_s)
            tg.append(s.decode_tokens_per_s)
            ttft.append(s.ttft_ms)
            times = s.token_times_ms
            gaps.extend(b - a for a, b in zip(times, times[1:]))
        pp_m, pp_s = mean_std(pp)
        tg_m, tg_s = mean_std(tg)
        rows.append(
            BenchRow(
                prompt_tokens=p,
                gen_tokens=gen_tokens,
                reps=reps,
                pp_tokens_per_s=pp_m,
                pp_std=pp_s,
                tg_tokens_per_s=tg_m,
                tg_std=tg_s,
                ttft_ms=mean_std(ttft)[0],
                itl_p50_ms=percentile(gaps, 50) if gaps else None,
                itl_p95_ms=percentile(gaps, 95) if gaps else None,
            )
        )
    return rows
