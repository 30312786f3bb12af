"""/v1/embeddings throughput: localllm serve against llama-server
``--embeddings --pooling mean`` on the same model, inputs, threads and batch.

Inputs are sentences of ``models/data/prose.txt`` (varied lengths), sent
``--per-request`` at a time by 1 and 4 concurrent clients; each server gets a
warm-up request first. Throughput is inputs (and tokens) per second of wall
time. The vectors of the two servers are compared too (cosine, mean pooling,
both normalized): a fast server that embeds differently would be no match.
Target (issue 25): localllm serve >= 0.9x llama-server. Also run as
``scripts/bench_serve.py --embeddings``.

    python scripts/bench_embed.py [--quick] [--threads N] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.bench_serve import free_port, start_server, stop_server, wait_ready  # noqa: E402

LLAMA_SERVERS = (Path.home() / ".cache/localllm/llama.cpp-tools/bin/llama-server",
                 Path.home() / ".cache/localllm/llama.cpp-tools/0.3.36/build/bin/llama-server")


def sentences(n: int) -> list[str]:
    text = (REPO / "models/data/prose.txt").read_text()
    parts = [s.strip() for s in text.replace("\n", " ").split(". ") if len(s.strip()) > 20]
    return [parts[i % len(parts)] for i in range(n)]


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
    ap.add_argument("--inputs", type=int, default=256)
    ap.add_argument("--per-request", type=int, default=16)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quick", action="store_true", help="CI: 32 inputs, 1 client, localllm serve only")
    ap.add_argument("--llama-server-first", action="store_true", help="measure llama-server before localllm serve (the order's effect)")
    ap.add_argument("--llama-server", type=Path, default=next((p for p in LLAMA_SERVERS if p.exists()), LLAMA_SERVERS[0]))
    args = ap.parse_args(argv)
    if args.quick:
        args.inputs, args.clients = 32, "1"
    levels = [int(x) for x in args.clients.split(",")]
    from localllm.store.resolver import resolve

    path = str(resolve(args.model))
    inputs = sentences(args.inputs)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_embed_logs"
    log_dir.mkdir(exist_ok=True)
    port = free_port()
    servers = {"localllm serve": ([sys.executable, "-m", "localllm", "serve", path, "--port", str(port), "--parallel", "1", "--ctx", str(args.ctx),
                                   "--ubatch", str(args.ctx), "--threads", str(args.threads), "--pooling", "mean"], port)}
    results: dict[str, list[dict] | str] = {}
    if not args.quick:
        if args.llama_server.exists():
            port = free_port()
            np_ = max(levels)
            servers["llama-server"] = ([str(args.llama_server), "-m", path, "--port", str(port), "--embeddings", "--pooling", "mean",
                                        "-np", str(np_), "-c", str(args.ctx * np_), "-kvu", "-b", str(args.ctx), "-ub", str(args.ctx),
                                        "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"], port)
        else:
            results["llama-server"] = f"not built ({args.llama_server} missing)"
    if args.llama_server_first:
        servers = dict(reversed(list(servers.items())))
    procs = {}
    try:
        for name, (cmd, port) in servers.items():  # one server at a time: they do not share the cores
            proc, base = start_server("embed_" + name.replace(" ", "_"), cmd, port, log_dir)
            procs[name] = proc
            try:
                wait_ready(proc, base)
                results[name] = [run_level(base, inputs, args.per_request, c) for c in levels]
            except Exception as exc:
                results[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
            finally:
                stop_server(proc)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                stop_server(proc)
    lines = [f"bench_embed: {Path(path).name}, {len(inputs)} inputs ({args.per_request} a request), ctx {args.ctx}, {args.threads} threads, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"machine: {os.cpu_count()} CPUs shared with other jobs: figures are noisy, compare within one run only.", "",
             "| server | clients | inputs | tokens | seconds | inputs/s | tokens/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        if isinstance(rows, str):
            lines.append(f"| {name} | {rows} | | | | | |")
            continue
        for r in rows:
            lines.append(f"| {name} | {r['clients']} | {r['inputs']} | {r['tokens']} | {r['s']:.2f} | {r['inputs_per_s']:.1f} | {r['tokens_per_s']:.1f} |")
    ours, theirs = results.get("localllm serve"), results.get("llama-server")
    lines.append("")
    if isinstance(ours, list) and isinstance(theirs, list):
        cos = [cosine(a, b) for a, b in zip(ours[0]["vectors"], theirs[0]["vectors"])]
        lines.append(f"- vectors, localllm serve vs llama-server: cosine min {min(cos):.5f}, mean {sum(cos) / len(cos):.5f}")
        for a, b in zip(ours, theirs):
            ratio = a["tokens_per_s"] / b["tokens_per_s"]
            lines.append(f"- embeddings throughput, localllm serve / llama-server at {a['clients']} client(s) (target >= 0.9): {ratio:.2f} "
                         f"({'met' if ratio >= 0.9 else 'NOT met'})")
    else:
        lines.append("- embeddings throughput, localllm serve / llama-server (target >= 0.9): n/a (llama-server not measured)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
