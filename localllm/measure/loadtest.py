"""``localllm bench --url``: load-test any OpenAI-compatible server.

Only the standard API: ``GET /v1/models`` and streaming ``POST /v1/completions``
(``stream_options.include_usage`` asked for; ``ignore_eos`` sent as the
llama.cpp/vLLM extension other servers ignore). For each concurrency level,
that many clients stream requests back to back until ``--requests`` are done.

- TTFT: from sending the request to the first chunk that carries text;
- ITL: gaps between text chunks (a server that packs several tokens in a
  chunk shows fewer, longer gaps);
- tokens: ``usage.completion_tokens`` where the server sends it, else the
  number of text chunks (the row says which: "usage", "stream" or "mixed");
- tok/s: generated tokens of all requests over the wall time of the level.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localllm.engine_api.stats import percentile
from localllm.errors import InputError
from localllm.util import fmt

WORDS = ("the time people year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact water room mother area money story month lot right study book "
         "job word business issue side kind head house service friend father power hour game line end member law car city").split()


def make_prompt(n_words: int, seed: int) -> str:
    """About ``n_words`` tokens of plain words (one token each in most vocabularies),
    different per seed so that no server can answer from a prefix cache."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def api_base(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class Sample:
    ok: bool
    error: str | None = None
    ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    completion_tokens: int | None = None  # from usage
    prompt_tokens: int | None = None
    first_s: float | None = None
    last_s: float | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.chunks


@dataclass
class Row:
    concurrency: int
    requests: int
    errors: int
    prompt_tokens: float | None  # mean, from usage; None when the server does not say
    gen_tokens: int
    token_source: str
    wall_s: float
    tokens_per_s: float | None
    requests_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_max_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    itl_max_ms: float | None
    stream_tok_per_s_p50: float | None  # one stream's decode rate: (chunks - 1) / (last - first chunk)
    first_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _one(client, base: str, body: dict, headers: dict, timeout: float) -> Sample:
    t0 = time.perf_counter()
    s = Sample(ok=False)
    last = None
    try:
        async with client.stream("POST", f"{base}/completions", json=body, headers=headers, timeout=timeout) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                s.error = f"HTTP {r.status_code}: {text[:200]}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if isinstance(obj, dict) and obj.get("error"):
                    s.error = f"stream error: {str(obj['error'])[:200]}"
                    return s
                usage = obj.get("usage") if isinstance(obj, dict) else None
                if usage:
                    s.completion_tokens = usage.get("completion_tokens")
                    s.prompt_tokens = usage.get("prompt_tokens")
                for ch in obj.get("choices") or []:
                    if ch.get("text"):
                        now = time.perf_counter()
                        if last is None:
                            s.ttft_ms = (now - t0) * 1e3
                            s.first_s = now
                        else:
                            s.gaps_ms.append((now - last) * 1e3)
                        last = s.last_s = now
                        s.chunks += 1
        s.ok = True
    except Exception as exc:  # a load test counts failures, it does not stop on them
        s.error = f"{type(exc).__name__}: {exc}"[:200]
    return s


async def _level(client, base: str, model: str, concurrency: int, n_requests: int, prompt_tokens: int, gen_tokens: int,
                 headers: dict, timeout: float, seed: int, extra: dict | None = None) -> Row:
    todo = list(range(n_requests))
    samples: list[Sample] = []

    async def worker() -> None:
        while todo:
            i = todo.pop()
            body = {"model": model, "prompt": make_prompt(prompt_tokens, seed + i), "max_tokens": gen_tokens, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, **(extra or {})}
            samples.append(await _one(client, base, body, headers, timeout))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return summarize(samples, concurrency, wall)


def summarize(samples: Sequence[Sample], concurrency: int, wall: float) -> Row:
    ok = [s for s in samples if s.ok]
    errors = [s for s in samples if not s.ok]
    ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    gaps = [g for s in ok for g in s.gaps_ms]
    with_usage = sum(1 for s in ok if s.completion_tokens is not None)
    source = "usage" if ok and with_usage == len(ok) else "stream" if with_usage == 0 else "mixed"
    gen = sum(s.tokens for s in ok)
    prompts = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    rates = [(s.chunks - 1) / (s.last_s - s.first_s) for s in ok
             if s.chunks > 1 and s.first_s is not None and s.last_s is not None and s.last_s > s.first_s]

    def pct(xs: list[float], q: float) -> float | None:
        return percentile(xs, q) if xs else None

    return Row(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(errors),
        prompt_tokens=sum(prompts) / len(prompts) if prompts else None,
        gen_tokens=gen,
        token_source=source,
        wall_s=wall,
        tokens_per_s=gen / wall if ok and wall > 0 else None,
        requests_per_s=len(ok) / wall if ok and wall > 0 else None,
        ttft_p50_ms=pct(ttft, 50),
        ttft_p95_ms=pct(ttft, 95),
        ttft_max_ms=max(ttft) if ttft else None,
        itl_p50_ms=pct(gaps, 50),
        itl_p95_ms=pct(gaps, 95),
        itl_max_ms=max(gaps) if gaps else None,
        stream_tok_per_s_p50=pct(rates, 50),
        first_error=errors[0].error if errors else None,
    )


async def _models(client, base: str, headers: dict) -> list[str]:
    r = await client.get(f"{base}/models", headers=headers, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"GET {base}/models answered HTTP {r.status_code}: {r.text[:200]}")
    return [str(m["id"]) for m in r.json().get("data", []) if isinstance(m, dict) and m.get("id")]


async def measure(url: str, *, model: str | None, concurrency: Sequence[int], requests: int | None, prompt_tokens: Sequence[int],
                  gen_tokens: int, api_key: str | None, timeout: float = 300.0, warmup: bool = True, progress=None,
                  extra: dict | None = None, seed: int = 0) -> tuple[str, list[Row]]:
    """Rows for each (prompt length, concurrency); returns the model name asked for too.
    ``extra``: fields added to (or replacing) every request body's (scripts/bench_serve.py's grammar).
    ``seed``: added to every prompt's seed, so that a repeated measurement sends
    prompts no server has cached (bench_serve's pairs)."""
    import httpx2

    base = api_base(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx2.Limits(max_connections=max(concurrency) + 2, max_keepalive_connections=max(concurrency) + 2)
    async with httpx2.AsyncClient(limits=limits) as client:
        if model is None:
            names = await _models(client, base, headers)
            if not names:
                raise RuntimeError(f"{base}/models lists no model: pass --model NAME")
            model = names[0]
        if warmup:
            if progress:
                progress("warm-up")
            await _level(client, base, model, 1, 1, min(prompt_tokens), min(gen_tokens, 8), headers, timeout, seed=seed + 10_000)
        rows = []
        for p in prompt_tokens:
            for c in concurrency:
                n = requests or max(4, 2 * c)
                if progress:
                    progress(f"prompt {p}, {c} concurrent, {n} requests")
                rows.append(await _level(client, base, model, c, n, p, gen_tokens, headers, timeout, seed=seed + 1000 * p + 100 * c,
                                         extra=extra))
        return model, rows


def table(rows: Sequence[Row]) -> str:
    def f(x: float | None, spec: str = ".1f") -> str:
        return "n/a" if x is None else format(x, spec)

    lines = ["| clients | reqs | errors | prompt | gen tok | tok/s | req/s | TTFT p50 | TTFT p95 | TTFT max | ITL p50 | ITL p95 | ITL max | tokens from |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.concurrency} | {r.requests} | {r.errors} | {f(r.prompt_tokens, '.0f')} | {r.gen_tokens} | {f(r.tokens_per_s, '.2f')} | "
                     f"{f(r.requests_per_s, '.3f')} | {f(r.ttft_p50_ms)} ms | {f(r.ttft_p95_ms)} ms | {f(r.ttft_max_ms)} ms | "
                     f"{f(r.itl_p50_ms)} ms | {f(r.itl_p95_ms)} ms | {f(r.itl_max_ms)} ms | {r.token_source} |")
    return "\n".join(lines)


def run_url(args) -> int:
    """The CLI side of ``bench --url``."""
    import os
    import sys


    progress = None if args.json else (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    try:
        model, rows = asyncio.run(measure(
            args.url, model=args.served_model or args.model, concurrency=args.concurrency, requests=args.requests,
            prompt_tokens=args.prompt_tokens or [128], gen_tokens=args.gen_tokens, timeout=args.timeout,
            api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), progress=progress))
    except Exception as exc:
        raise InputError(f"cannot bench {args.url}: {type(exc).__name__}: {exc}"[:400]) from None
    if args.json:
        fmt.print_json([{"url": api_base(args.url), "model": model, "gen_tokens_asked": args.gen_tokens, **r.to_dict()} for r in rows])
    else:
        print(f"{api_base(args.url)} · model {model} · {args.gen_tokens} tokens asked per request (ignore_eos)\n")
        print(table(rows))
    return 1 if all(r.errors == r.requests for r in rows) else 0
