"""/v1/embeddings throughput: localllm serve against llama-server
``--embeddings --pooling mean`` on the same model, inputs, threads and batch.

Inputs are sentences of ``models/data/prose.txt`` (varied lengths), sent
``--per-request`` at a time by 1 and 4 concurrent clients; each server gets a
warm-up request first. Throughput is tokens per second of wall time. Both
servers stay up, and are measured in turns, round after round, the order
flipped each round (other groupings of the sentences each round, the same for
both): the figure is the geometric mean of the per-round ratios with its 95%
interval (scripts/bench_serve.py's ``verdict_line``). One server after the
other, once each, read 0.88 to 1.15 in one hour here: the machine's load, not
the servers. The vectors of the two servers are compared too (cosine, mean
pooling, both normalized): a fast server that embeds differently would be no
match. Target (issue 25): localllm serve >= 0.9x llama-server. Also run as
``scripts/bench_serve.py --embeddings``.

    python scripts/bench_embed.py [--quick] [--rounds N] [--threads N] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.plan.hardware import physical_cores  # noqa: E402
from scripts.llama_tools import tool  # noqa: E402
from scripts.paired_runs import free_port, start_server, stop_server, verdict_line, wait_ready  # noqa: E402

OURS, THEIRS = "localllm serve", "llama-server"


@functools.cache
def _sentences() -> tuple[str, ...]:
    """The prose file's sentences, read once for all rounds."""
    text = (REPO / "models/data/prose.txt").read_text()
    return tuple(s.strip() for s in text.replace("\n", " ").split(". ") if len(s.strip()) > 20)


def sentences(n: int, offset: int = 0, max_words: int | None = None) -> list[str]:
    """``n`` sentences from ``offset`` on, each cut to its first ``max_words`` words
    if given (--quick: fewer tokens to embed)."""
    parts = _sentences()
    picked = [parts[(i + offset) % len(parts)] for i in range(n)]
    return picked if max_words is None else [" ".join(p.split()[:max_words]) for p in picked]


def run_level(base: str, inputs: list[str], per_request: int, clients: int) -> dict:
    import httpx2

    groups = [inputs[i:i + per_request] for i in range(0, len(inputs), per_request)]

    def one(group: list[str]) -> tuple[int, list[list[float]]]:
        with httpx2.Client(timeout=600) as c:
            r = c.post(base + "/v1/embeddings", json={"input": group, "model": "m", "encoding_format": "float"})
            r.raise_for_status()
            body = r.json()
            return int(body["usage"]["prompt_tokens"]), [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]

    one(groups[0])  # warm-up (our embedding context is made on first use)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(one, groups))
    secs = time.perf_counter() - t0
    tokens = sum(t for t, _ in done)
    return {"clients": clients, "inputs": len(inputs), "tokens": tokens, "s": secs, "inputs_per_s": len(inputs) / secs,
            "tokens_per_s": tokens / secs, "vectors": [v for _, vs in done for v in vs]}


def cosine(a: list[float], b: list[float]) -> float:
    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--inputs", type=int, default=128)
    ap.add_argument("--per-request", type=int, default=16)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=physical_cores(), help="default: the physical cores this process may use")
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds, order flipped each round (rounded up to an even count)")
    ap.add_argument("--quick", action="store_true", help="CI: 8 inputs of at most 12 words, 4 a request, 1 client, one round, localllm serve only")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server (default: the one scripts/build_llama_tools.sh built)")
    args = ap.parse_args(argv)
    if args.llama_server is None:
        args.llama_server = tool("llama-server")
    if args.quick:  # 4 a request: still batched, and the warm-up request (the first group) embeds half of them, not all again
        args.inputs, args.per_request, args.clients = 8, 4, "1"
    rounds = 1 if args.quick else max(2, args.rounds + args.rounds % 2)  # both orders equally often
    levels = [int(x) for x in args.clients.split(",")]
    from localllm.store.resolver import resolve

    path = str(resolve(args.model))
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_embed_logs"
    log_dir.mkdir(exist_ok=True)
    port = free_port()
    servers = {OURS: ([sys.executable, "-m", "localllm", "serve", path, "--port", str(port), "--parallel", "1", "--ctx", str(args.ctx),
                       "--ubatch", str(args.ctx), "--threads", str(args.threads), "--pooling", "mean"], port)}
    missing = "llama-server not run (--quick)" if args.quick else f"llama-server not built ({args.llama_server} missing)"
    if not args.quick and args.llama_server.exists():
        port = free_port()
        np_ = max(levels)
        servers[THEIRS] = ([str(args.llama_server), "-m", path, "--port", str(port), "--embeddings", "--pooling", "mean",
                            "-np", str(np_), "-c", str(args.ctx * np_), "-kvu", "-b", str(args.ctx), "-ub", str(args.ctx),
                            "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"], port)
    first: dict[str, list[dict]] = {}
    ratios: dict[int, list[float]] = {c: [] for c in levels}
    failed: str | None = None
    procs: dict[str, tuple] = {}
    try:
        for name, (cmd, port) in servers.items():  # both stay up, idle while the other is measured
            procs[name] = start_server("embed_" + name.replace(" ", "_"), cmd, port, log_dir)
        for proc, base in procs.values():
            wait_ready(proc, base)
        for r in range(rounds):
            # other groupings each round, the same for both servers
            inputs = sentences(args.inputs, offset=r * 7, max_words=12 if args.quick else None)
            order = list(procs)[:: 1 if r % 2 == 0 else -1]
            for c in levels:
                got = {name: run_level(procs[name][1], inputs, args.per_request, c) for name in order}
                for name, row in got.items() if r == 0 else ():
                    first.setdefault(name, []).append(row)
                if THEIRS in got:
                    ratios[c].append(got[OURS]["tokens_per_s"] / got[THEIRS]["tokens_per_s"])
    except Exception as exc:
        failed = f"failed: {type(exc).__name__}: {exc}"[:200]
    finally:
        for proc, _ in procs.values():
            stop_server(proc)
    lines = [f"bench_embed: {Path(path).name}, {args.inputs} inputs ({args.per_request} a request), ctx {args.ctx}, {args.threads} threads, "
             f"{rounds} round(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"machine: {os.cpu_count()} CPUs shared with other jobs: figures are noisy, compare within one run only.", "",
             "The first round:", "",
             "| server | clients | inputs | tokens | seconds | inputs/s | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows in first.items():
        for row in rows:
            lines.append(f"| {name} | {row['clients']} | {row['inputs']} | {row['tokens']} | {row['s']:.2f} | {row['inputs_per_s']:.1f} | "
                         f"{row['tokens_per_s']:.1f} |")
    if failed:
        lines.append(f"| {failed} | | | | | | |")
    lines.append("")
    if first.get(OURS) and first.get(THEIRS):
        cos = [cosine(a, b) for a, b in zip(first[OURS][0]["vectors"], first[THEIRS][0]["vectors"])]
        lines.append(f"- vectors, localllm serve vs llama-server: cosine min {min(cos):.5f}, mean {sum(cos) / len(cos):.5f}")
    for c in levels:  # a run that failed part way has pairs of one order more than the other: no verdict from it
        lines.append(verdict_line(f"embeddings throughput (tokens/s), localllm serve / llama-server at {c} client(s) (target >= 0.9)",
                                  [] if failed else ratios[c], 0.9, failed or missing))
    print("\n".join(lines))
    return 0 if failed is None else 1


if __name__ == "__main__":
    sys.exit(main())
