"""/v1/rerank throughput: localllm serve ``--rerank`` against llama-server
``--rerank`` on the same model, documents, threads and batch.

The model is scripts/synth_gguf.py's tiny BERT reranker (written to a temporary
folder) unless ``--model`` names another. Documents are sentences of
``models/data/prose.txt`` (varied lengths) ranked against one of them,
``--per-request`` at a time by 1 and 4 concurrent clients; each server gets a
warm-up request first. Throughput is documents per second of wall time. Both
servers stay up and are measured in turns, round after round, the order flipped
each round (other groupings each round, the same for both): the figure is the
geometric mean of the per-round ratios with its 95% interval
(scripts/bench_serve.py's ``verdict_line``), since the machine's load moves one
server-after-the-other figures by more than the difference measured. The scores
of the two servers are compared too (largest relative difference per
document): a fast server that scores differently would be no match. Target
(issue 47): localllm serve >= 0.9x llama-server. Each server's CPU seconds per
document (its process's user + system time over the level) are shown beside:
the machine's other load stretches wall time (a thread waiting for a CPU), not
the work done, so they tell an engine that does more work from a wait.

llama-server gets ``-np 16`` (16 pairs a batch, as serve's rank context takes
up to 16) and ``-b``/``-ub`` 512, serve its defaults (--ubatch 512). The scores
agree to about 1e-3 relative at worst, not bit for bit: with flash attention,
llama.cpp's score for a pair moves by that much with what shares its batch
(llama-server's own, too), and the two servers group pairs differently; a pair
alone is bit for bit the same (tests/serve/test_rerank.py).

    python scripts/bench_rerank.py [--quick] [--rounds N] [--threads N] [--model M] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.plan.hardware import physical_cores  # noqa: E402
from scripts.llama_tools import tool  # noqa: E402
from scripts.paired_runs import free_port, start_server, stop_server, verdict_line, wait_ready  # noqa: E402

OURS, THEIRS = "localllm serve", "llama-server"
NP = 16  # llama-server's slots: pairs in one batch


@functools.cache
def _sentences() -> tuple[str, ...]:
    """The prose file's sentences, read once for all rounds."""
    text = (REPO / "models/data/prose.txt").read_text()
    return tuple(s.strip() for s in text.replace("\n", " ").split(". ") if len(s.strip()) > 20)


def documents(n: int, offset: int = 0, max_chars: int = 200) -> list[str]:
    """``n`` sentences, each cut to ``max_chars``: the synthetic vocabulary spells
    most words byte by byte, about a token a character, and a pair must fit a ubatch."""
    parts = _sentences()
    return [parts[(i + offset) % len(parts)][:max_chars] for i in range(n)]


def run_level(base: str, query: str, docs: list[str], per_request: int, clients: int, pid: int) -> dict:
    import httpx2
    import psutil

    groups = [docs[i:i + per_request] for i in range(0, len(docs), per_request)]

    def one(group: list[str]) -> tuple[int, list[float]]:
        with httpx2.Client(timeout=600) as c:
            r = c.post(base + "/v1/rerank", json={"query": query, "documents": group, "model": "m"})
            r.raise_for_status()
            body = r.json()
            by_index = {x["index"]: x["relevance_score"] for x in body["results"]}
            return int(body["usage"]["prompt_tokens"]), [by_index[i] for i in range(len(group))]

    one(groups[0])  # warm-up
    proc = psutil.Process(pid)
    c0 = sum(proc.cpu_times()[:2])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(one, groups))
    secs = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - c0  # the server's CPU seconds: what a loaded machine's waits leave out
    return {"clients": clients, "docs": len(docs), "tokens": sum(t for t, _ in done), "s": secs, "docs_per_s": len(docs) / secs,
            "cpu_ms_per_doc": 1000 * cpu / len(docs), "scores": [s for _, ss in done for s in ss]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a reranker GGUF or name (default: the synthetic BERT reranker)")
    ap.add_argument("--docs", type=int, default=512, help="documents a round, per client level")
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--max-chars", type=int, default=200, help="documents cut to this many characters (default: 200)")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--threads", type=int, default=None, help="default: the physical cores this process may use (--quick: 1)")
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds, order flipped each round (rounded up to an even count)")
    ap.add_argument("--quick", action="store_true", help="CI: 64 documents, 1 client, one round, 1 thread (both servers: the model is tiny)")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server (default: the one scripts/build_llama_tools.sh built)")
    args = ap.parse_args(argv)
    if args.llama_server is None:
        args.llama_server = tool("llama-server")
    if args.quick:
        args.docs, args.clients = 64, "1"
    if args.threads is None:  # quick: one thread, as a shared machine's other load stalls ggml's threads at each barrier
        args.threads = 1 if args.quick else physical_cores()
    rounds = 1 if args.quick else max(2, args.rounds + args.rounds % 2)  # both orders equally often
    levels = [int(x) for x in args.clients.split(",")]
    tmp = tempfile.TemporaryDirectory(prefix="bench_rerank_")
    if args.model is None:
        from scripts.synth_gguf import write_reranker_gguf

        path = str(write_reranker_gguf(Path(tmp.name) / "synthetic-reranker.gguf"))
    else:
        from localllm.store.resolver import resolve

        path = str(resolve(args.model))
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_rerank_logs"
    log_dir.mkdir(exist_ok=True)
    port = free_port()
    servers = {OURS: ([sys.executable, "-m", "localllm", "serve", path, "--port", str(port), "--rerank", "--parallel", "1",
                       "--threads", str(args.threads)], port)}
    missing = f"llama-server not built ({args.llama_server} missing)"
    if args.llama_server.exists():
        port = free_port()
        servers[THEIRS] = ([str(args.llama_server), "-m", path, "--port", str(port), "--rerank", "-np", str(NP), "-c", str(512 * NP),
                            "-b", "512", "-ub", "512", "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"], port)
    first: dict[str, list[dict]] = {}
    ratios: dict[int, list[float]] = {c: [] for c in levels}
    cpu_ratios: dict[int, list[float]] = {c: [] for c in levels}  # llama-server's CPU per document / serve's
    worst, worst_abs = 0.0, 0.0
    failed: str | None = None
    procs: dict[str, tuple] = {}
    try:
        for name, (cmd, port) in servers.items():  # both stay up, idle while the other is measured
            procs[name] = start_server("rerank_" + name.replace(" ", "_"), cmd, port, log_dir)
        for proc, base in procs.values():
            wait_ready(proc, base)
        for r in range(rounds):
            docs = documents(args.docs + 1, offset=r * 7, max_chars=args.max_chars)  # other groupings each round, the same for both
            query, docs = docs[0][:60], docs[1:]
            order = list(procs)[:: 1 if r % 2 == 0 else -1]
            for c in levels:
                got = {name: run_level(procs[name][1], query, docs, args.per_request, c, procs[name][0].pid) for name in order}
                for name, row in got.items() if r == 0 else ():
                    first.setdefault(name, []).append(row)
                if THEIRS in got:
                    ratios[c].append(got[OURS]["docs_per_s"] / got[THEIRS]["docs_per_s"])
                    cpu_ratios[c].append(got[THEIRS]["cpu_ms_per_doc"] / got[OURS]["cpu_ms_per_doc"])
                    pairs = list(zip(got[OURS]["scores"], got[THEIRS]["scores"]))
                    worst_abs = max([worst_abs] + [abs(a - b) for a, b in pairs])
                    worst = max([worst] + [abs(a - b) / abs(b) for a, b in pairs if abs(b) >= 0.1])  # a score near 0 has no relative figure
    except Exception as exc:
        failed = f"failed: {type(exc).__name__}: {exc}"[:200]
    finally:
        for proc, _ in procs.values():
            stop_server(proc)
        tmp.cleanup()
    lines = [f"bench_rerank: {Path(path).name}, {args.docs} documents ({args.per_request} a request), {args.threads} threads, "
             f"{rounds} round(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"machine: {os.cpu_count()} CPUs shared with other jobs: figures are noisy, compare within one run only.", "",
             "The first round:", "",
             "| server | clients | documents | tokens | seconds | documents/s | server CPU ms/document |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows in first.items():
        for row in rows:
            lines.append(f"| {name} | {row['clients']} | {row['docs']} | {row['tokens']} | {row['s']:.2f} | {row['docs_per_s']:.1f} | "
                         f"{row['cpu_ms_per_doc']:.2f} |")
    if failed:
        lines.append(f"| {failed} | | | | | | |")
    lines.append("")
    if first.get(OURS) and first.get(THEIRS):
        lines.append(f"- scores, localllm serve vs llama-server: largest difference {worst_abs:.2e}; relative, of scores |s| >= 0.1, {worst:.2e}")
    for c in levels:  # a run that failed part way has pairs of one order more than the other: no verdict from it
        lines.append(verdict_line(f"rerank throughput (documents/s), localllm serve / llama-server at {c} client(s) (target >= 0.9)",
                                  [] if failed else ratios[c], 0.9, failed or missing))
        lines.append(verdict_line(f"server CPU per document, llama-server / localllm serve at {c} client(s) (the same work for less CPU: > 1)",
                                  [] if failed else cpu_ratios[c], 0.9, failed or missing))
    print("\n".join(lines))
    return 0 if failed is None else 1


if __name__ == "__main__":
    sys.exit(main())
