"""Anthropic's /v1/messages and OpenAI's /v1/responses against /v1/chat/completions
on one ``localllm serve`` (issue 47): the same prompt, greedy, streamed, each
route's decode rate as its client reads it (tokens after the first over the
time from the first text delta to the last), and aggregate tokens/s with
several clients at once. The three routes share one engine, so the target is
>= 0.97x chat completions' rate; what differs is the translation of the body
and the shaping of each streamed event.

Measured in rounds, the order of the routes rotating each round (so that the
load of a shared machine, and going first, hit all alike); the figure is the
geometric mean of the per-round ratios, with its 95% interval
(paired_runs.verdict_line). Each round sends a prompt of its own (no route
reads another's cached prompt in the same way twice).

    python scripts/bench_agents.py [--quick] [--rounds N] [--clients 1,4]
    python scripts/bench_agents.py --claude-code [--quick] [--rounds N]   # Claude Code's first request: scripts/bench_claude_code.py
    python scripts/bench_serve.py --agents [...]           # the same
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.plan.hardware import physical_cores  # noqa: E402
from scripts.paired_runs import free_port, serve_cmd, start_server, stop_server, verdict_line, wait_ready  # noqa: E402

ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def _body(route: str, prompt: str, gen: int) -> dict:
    if route == "/v1/messages":
        return {"model": "m", "max_tokens": gen, "temperature": 0, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    if route == "/v1/responses":
        return {"model": "m", "max_output_tokens": gen, "temperature": 0, "stream": True, "input": prompt}
    return {"model": "m", "max_tokens": gen, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}]}


def _text_and_tokens(route: str, event: dict) -> tuple[bool, int | None]:
    """(whether ``event`` carries reply text, the reply's token count if it says it)."""
    if route == "/v1/messages":
        kind = event.get("type")
        return kind == "content_block_delta", event["usage"]["output_tokens"] if kind == "message_delta" else None
    if route == "/v1/responses":
        kind = event.get("type")
        done = kind in ("response.completed", "response.incomplete")
        return kind == "response.output_text.delta", event["response"]["usage"]["output_tokens"] if done else None
    choices = event.get("choices") or []
    usage = event.get("usage")
    return bool(choices and choices[0].get("delta", {}).get("content")), usage["completion_tokens"] if usage else None


def stream_one(client, base: str, route: str, prompt: str, gen: int) -> tuple[int, float, float, float]:
    """(tokens, start, first text, last text) of one streamed request, times in seconds."""
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    with client.stream("POST", base + route, json=_body(route, prompt, gen)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            text, n = _text_and_tokens(route, json.loads(line[6:]))
            if text:
                last = time.perf_counter()
                first = first or last
            if n is not None:
                tokens = n
    return tokens, start, first, last


def level(base: str, route: str, prompt: str, gen: int, clients: int) -> dict:
    """One level: ``clients`` streams at once, each its own variant of ``prompt``.
    The per-stream decode rate (1 client) and aggregate tokens/s over the wall time."""
    import httpx2

    results: list[tuple[int, float, float, float] | Exception] = [RuntimeError("not run")] * clients
    with httpx2.Client(timeout=300) as client:

        def run(i: int) -> None:
            try:
                results[i] = stream_one(client, base, route, f"{prompt} (client {i})" if i else prompt, gen)
            except Exception as exc:  # reported in the table, never a traceback
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        return {"error": f"{type(failed[0]).__name__}: {failed[0]}"[:200]}
    ok = [r for r in results if not isinstance(r, Exception)]
    rates = [(n - 1) / (b - a) for n, _, a, b in ok if n > 1 and b > a]
    return {"tokens": sum(n for n, *_ in ok), "decode": statistics.median(rates) if rates else None,
            "aggregate": sum(n for n, *_ in ok) / wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per ratio (default: %(default)s)")
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--quick", action="store_true", help="CI: 1 client, 1 round, 16 tokens (the figures are noise)")
    argv = sys.argv[1:] if argv is None else argv
    if "--claude-code" in argv:
        from scripts import bench_claude_code

        return bench_claude_code.main([a for a in argv if a != "--claude-code"])
    args = ap.parse_args(argv)
    if args.quick:
        args.clients, args.gen_tokens, args.rounds = "1", 16, 1
    clients = [int(x) for x in args.clients.split(",")]
    from localllm.store.resolver import resolve

    path = str(resolve(args.model))
    log_dir = Path("/tmp") / "bench_agents_logs"
    log_dir.mkdir(exist_ok=True)
    port = free_port()
    proc, base = start_server("localllm-serve", serve_cmd(path, port, max(clients), args.ctx, args.threads), port, log_dir)
    rows: dict[tuple[str, int], list[dict]] = {}
    try:
        wait_ready(proc, base)
        import httpx2

        with httpx2.Client(timeout=120) as warm:
            stream_one(warm, base, ROUTES[0], "Hello", 4)  # warm-up: the first request's one-time costs
        for r in range(args.rounds):
            prompt = f"Round {r}. Count from 1 to 200, one number after another, separated by commas:"
            for c in clients:
                for route in ROUTES[r % 3:] + ROUTES[:r % 3]:  # rotated: each route goes first as often
                    print(f"  round {r + 1}/{args.rounds}, {c} client(s), {route}", file=sys.stderr, flush=True)
                    rows.setdefault((route, c), []).append(level(base, route, prompt, args.gen_tokens, c))
    finally:
        stop_server(proc)
    lines = [f"bench_agents: {Path(path).name}, {args.gen_tokens} tokens per request, greedy, {args.threads} threads, {args.rounds} round(s), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| route | clients | tokens (last round) | decode tok/s per stream (median of rounds) | aggregate tok/s (median) |", "|---|---|---|---|---|"]
    for (route, c), got in rows.items():
        good = [g for g in got if "error" not in g]
        dec = [g["decode"] for g in good if g["decode"]]
        agg = [g["aggregate"] for g in good]
        note = f" ({len(got) - len(good)} failed: {next(g['error'] for g in got if 'error' in g)})" if len(good) < len(got) else ""
        lines.append(f"| {route} | {c} | {good[-1]['tokens'] if good else 'n/a'} | {statistics.median(dec) if dec else float('nan'):.1f} | "
                     f"{statistics.median(agg) if agg else float('nan'):.1f} |{note}")
    lines.append("")
    for route in ROUTES[1:]:
        for c in clients:
            key = "decode" if c == 1 else "aggregate"
            ratios = [a[key] / b[key] for a, b in zip(rows[(route, c)], rows[(ROUTES[0], c)])
                      if "error" not in a and "error" not in b and a.get(key) and b.get(key)]
            lines.append(verdict_line(f"{route} / {ROUTES[0]}, {key} tok/s at {c} client(s) (target >= 0.97)", ratios, 0.97))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
