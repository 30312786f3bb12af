"""localllm serve against the anchors, side by side in one run.

For 1, 2, 4 and 8 concurrent streaming clients (``localllm.measure.loadtest``, the
same client as ``localllm bench --url``): aggregate tokens/s, TTFT and ITL
p50/p95, for

- ``localllm serve`` (continuous batching, ``--parallel`` = most clients);
- llama-cpp-python's server (``python -m llama_cpp.server``; one request at a time);
- llama.cpp's ``llama-server`` (``-np`` = ``--parallel``, unified KV cache like ours)
  as scripts/build_llama_tools.sh builds it (scripts/llama_tools.py finds it);

and ``localllm run``'s decode rate for one client. Same model file, threads,
context per sequence, greedy, ``ignore_eos`` so every request generates the
same number of tokens. Targets (issue 15): 8 clients >= 2.5x one client on
the same server, >= 0.9x llama-server; 1 client >= 0.95x ``localllm run``.

Then the paired ratios (issue 25): ``localllm serve`` and llama-server restarted
at each of ``--pair-threads``, and measured in turns, pair after pair (the order
flips each pair), so that the load of a shared machine hits both alike; the
geometric mean of the per-pair ratios over an even number of pairs is the
figure (the server measured first in a pair ran about 3% faster here, whichever
it was: an even count in both orders cancels that; a median of 7 pairs, 4 in
one order, did not): 1 client >= 0.95x llama-server,
8 clients >= 1.0x at 1 and at 2 threads; and, on ``serve`` alone, a
grammar-constrained reply's decode rate >= 0.85x the same reply unconstrained
(the prompt counts "1, 2, 3, 4, 5,", the grammar allows only more of that: the
reply is the same tokens with and without it, so only the grammar's cost differs),
measured after all the pairs: run between them, these serve-only levels came
before serve's turns in one order and before llama-server's in the other, and
1 client on 2 threads read 0.942-0.949 with them there against 0.985 without.
Last, /v1/embeddings against llama-server ``--embeddings --pooling mean``
(scripts/bench_embed.py, >= 0.9x), so that one run prints every target.

    python scripts/bench_serve.py [--quick] [--out FILE]
    python scripts/bench_serve.py --embeddings [--quick]   # /v1/embeddings: scripts/bench_embed.py
    python scripts/bench_serve.py --agents [--quick]       # /v1/messages and /v1/responses against chat: scripts/bench_agents.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.plan.hardware import physical_cores  # noqa: E402
from scripts.llama_tools import tool  # noqa: E402
from scripts.paired_runs import free_port, measure_level, rate_of, serve_cmd, start_server, stop_server, verdict_line, wait_ready  # noqa: E402

COUNT_PROMPT = "1, 2, 3, 4, 5,"
COUNT_GRAMMAR = 'root ::= (" " [1-9] [0-9]* ",")+'  # never complete: every request runs its full length under it


def llama_server_cmd(binary: Path, path: str, port: int, np_: int, ctx: int, threads: int) -> list[str]:
    """The same cache shape as serve's: ``np_`` sequences of ``ctx`` in one unified KV cache."""
    return [str(binary), "-m", path, "--port", str(port), "-np", str(np_), "-c", str(ctx * np_), "-kvu", "-t", str(threads), "-tb", str(threads),
            "--no-webui"]


def run_decode(args, model_path: str) -> tuple[float | None, float | None]:
    """localllm run at one client, best of 2 (one with --quick): llama.cpp's eval rate
    (time in llama_decode only) and the rate its tokens come out (1 / TPOT, what a
    stream's reader sees: decode + sampling + detokenizing)."""
    evals, seen = [], []
    for _ in range(1 if args.quick else 2):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "localllm",
                "run",
                model_path,
                "--raw",
                "-p",
                "1, 2, 3, 4, 5,",
                "-n",
                str(args.gen_tokens),
                "--temp",
                "0",
                "--ctx",
                str(args.ctx),
                "--threads",
                str(args.threads),
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )
        if p.returncode == 0:
            d = json.loads(p.stdout)
            evals.append(d["decode_tokens_per_s"])
            if d.get("tpot_ms"):
                seen.append(1000.0 / d["tpot_ms"])
    return (max(evals) if evals else None, max(seen) if seen else None)


def paired(args, path: str, log_dir: Path, running: tuple[subprocess.Popen, str] | None = None) -> list[str]:
    """The paired ratios (the module's docstring): serve and llama-server restarted at
    each thread count, then measured in turns; the report's lines. ``running``:
    a serve started with these options already (--quick's table's), used instead
    of starting one (and left running)."""
    top = max(args.clients)
    with_ls = not args.quick and args.llama_server.exists()
    missing = "llama-server not run (--quick)" if args.quick else f"llama-server not built ({args.llama_server} missing)"
    lines = ["", f"Paired ratios, tokens/s of all clients (geometric mean of {args.pairs} pair(s), order flipped each pair; "
             f"the machine's other load hits both servers of a pair alike):"]
    for threads in args.pair_threads:
        procs: dict[str, tuple[subprocess.Popen, str]] = {}
        ratios: dict[int, list[float]] = {1: [], top: []}
        grammar: list[float] = []
        try:
            if running is not None and threads == args.threads:
                serve_proc = running
            else:
                port = free_port()
                serve_proc = procs["serve"] = start_server(f"pair_serve_t{threads}", serve_cmd(path, port, top, args.ctx, threads), port, log_dir)
            if with_ls:
                port = free_port()
                procs["llama-server"] = start_server(f"pair_llama_server_t{threads}",
                                                     llama_server_cmd(args.llama_server, path, port, top, args.ctx, threads), port, log_dir)
            for proc, base in procs.values():
                wait_ready(proc, base)
            procs_all = {"serve": serve_proc, **procs}
            for r in range(args.pairs):
                for c in ratios if with_ls else ():
                    order = ["serve", "llama-server"][:: 1 if r % 2 == 0 else -1]
                    # fresh prompts each pair (the same for both servers): neither answers from a prompt it cached in an earlier pair
                    got = {n: rate_of(measure_level(f"{n} {threads}t", procs_all[n][1], c, args, first=r == 0, seed=1_000_000 * (r + 1)), "tokens_per_s")
                           for n in order}
                    if got["serve"] and got["llama-server"]:
                        ratios[c].append(got["serve"] / got["llama-server"])
            # serve against itself, after the pairs: serve-only levels between the pairs put
            # serve's own load before its turns and not before llama-server's
            for r in range(args.pairs if threads == args.threads else 0):
                order_g = [False, True][:: 1 if r % 2 == 0 else -1]
                rates = {g: rate_of(measure_level(f"serve {threads}t {'grammar' if g else 'plain'}", serve_proc[1], 1, args, first=False,
                                                  extra={"prompt": COUNT_PROMPT, **({"grammar": COUNT_GRAMMAR} if g else {})},
                                                  requests=quick_requests(args, 1)),
                                    "stream_tok_per_s_p50") for g in order_g}
                if rates[True] and rates[False]:
                    grammar.append(rates[True] / rates[False])
        except RuntimeError as exc:
            lines.append(f"- {threads} threads: a server failed to start: {exc}")
            continue
        finally:
            for proc, _ in procs.values():
                stop_server(proc)
        lines.append(verdict_line(f"serve / llama-server, 1 client, {threads} threads (target >= 0.95)", ratios[1], 0.95, missing))
        lines.append(verdict_line(f"serve / llama-server, {top} clients, {threads} threads (target >= 1.0)", ratios[top], 1.0, missing))
        if threads == args.threads:
            lines.append(verdict_line(f"grammar-constrained / unconstrained decode rate (per-stream tok/s), serve, 1 client, {threads} threads "
                                      "(target >= 0.85)", grammar, 0.85))
    return lines


def embeddings(args) -> list[str]:
    """The embeddings target's lines (scripts/bench_embed.py against llama-server
    --embeddings --pooling mean), so that one run prints every target; none in
    --quick (CI runs bench_embed's own quick mode) or with --no-embeddings."""
    if args.quick or args.no_embeddings:
        return []
    import contextlib
    import io

    from scripts import bench_embed  # lazy: it imports this module (a cycle at import time)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench_embed.main(["--threads", str(args.threads), "--inputs", "64", "--rounds", "6", "--model", args.model])
    return ["", *out.getvalue().rstrip().splitlines(), *([f"- bench_embed failed (exit {rc}): see its lines above"] if rc else [])]


def quick_requests(args, clients: int) -> int | None:
    """Requests at a level of ``clients``: one a client with --quick (its figures are
    noise either way: one request still prints each of them), else loadtest's default."""
    return clients if args.quick else None


def fmt(x, spec=".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    if "--embeddings" in sys.argv[1:]:  # /v1/embeddings against llama-server --embeddings (scripts/bench_embed.py)
        from scripts import bench_embed  # lazy: it imports this module (a cycle at import time), and only this mode needs it

        return bench_embed.main([a for a in sys.argv[1:] if a != "--embeddings"])
    if "--agents" in sys.argv[1:]:  # /v1/messages and /v1/responses against /v1/chat/completions (scripts/bench_agents.py)
        from scripts import bench_agents  # lazy: it imports this module (a cycle at import time), and only this mode needs it

        return bench_agents.main([a for a in sys.argv[1:] if a != "--agents"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence")
    ap.add_argument("--threads", type=int, default=physical_cores(), help="default: the physical cores this process may use")
    ap.add_argument("--quick", action="store_true", help="CI: 1,4 clients, one request a client, 8-token prompts, 8 tokens, localllm serve only")
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--skip-llama-cpp-python", action="store_true", help="leave llama-cpp-python's server out (it serves one request at a time: slow)")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary (default: the one scripts/build_llama_tools.sh built)")
    ap.add_argument("--pairs", type=int, default=4, help="pairs per paired ratio, rounded up to an even count (default: %(default)s)")
    ap.add_argument("--pair-threads", default="1,2", help="thread counts of the paired ratios (default: %(default)s)")
    ap.add_argument("--paired-only", action="store_true", help="only the paired ratios (the issue's targets), not the table")
    ap.add_argument("--no-embeddings", action="store_true", help="leave out /v1/embeddings against llama-server (scripts/bench_embed.py)")
    args = ap.parse_args()
    if args.llama_server is None:
        args.llama_server = tool("llama-server")
    args.pairs += args.pairs % 2  # both orders equally often (the docstring)
    if args.quick:
        args.clients, args.prompt_tokens, args.gen_tokens, args.pairs, args.pair_threads = "1,4", 8, 8, 1, str(args.threads)
    args.clients = [int(x) for x in args.clients.split(",")]
    args.pair_threads = [int(x) for x in args.pair_threads.split(",")]
    from localllm.store.resolver import resolve

    path = str(resolve(args.model))
    np_ = max(args.clients)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_serve_logs"
    log_dir.mkdir(exist_ok=True)
    if args.paired_only:
        report = "\n".join([f"bench_serve --paired-only: {Path(path).name}, prompt ~{args.prompt_tokens} tokens, {args.gen_tokens} generated "
                            f"per request, ctx {args.ctx} per sequence, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                            *paired(args, path, log_dir), *embeddings(args)])
        print(report)
        if args.out:
            Path(args.out).write_text(report + "\n")
        return 0
    servers: dict[str, tuple[list[str], int]] = {}
    port = free_port()
    servers["localllm serve"] = (serve_cmd(path, port, np_, args.ctx, args.threads), port)
    results: dict[str, list[dict] | str] = {}
    if not args.quick:
        try:
            if args.skip_llama_cpp_python:
                raise ImportError("left out with --skip-llama-cpp-python")
            import llama_cpp.server  # noqa: F401  (its 'server' extra is installed)

            port = free_port()
            servers["llama_cpp.server"] = (
                [
                    sys.executable,
                    "-m",
                    "llama_cpp.server",
                    "--model",
                    path,
                    "--port",
                    str(port),
                    "--n_ctx",
                    str(args.ctx),
                    "--n_threads",
                    str(args.threads),
                    "--n_threads_batch",
                    str(args.threads),
                ],
                port,
            )
        except ImportError as exc:
            results["llama_cpp.server"] = f"not installed ({exc})"
        if args.llama_server.exists():
            port = free_port()
            servers["llama-server"] = (llama_server_cmd(args.llama_server, path, port, np_, args.ctx, args.threads), port)
        else:
            results["llama-server"] = f"not built ({args.llama_server} missing)"
    # All servers up at once (idle ones cost no CPU); each concurrency level runs
    # on every server in turn, so that a comparison spans minutes, not the whole run.
    procs = {}
    pair_lines: list[str] | None = None
    try:
        for name, (cmd, port) in servers.items():
            procs[name] = start_server(name.replace(" ", "_").replace(".", "_"), cmd, port, log_dir)
        for name, (proc, base) in procs.items():
            try:
                wait_ready(proc, base)
                results[name] = []
            except RuntimeError as exc:
                results[name] = f"failed to start: {exc}"
        for i, c in enumerate(args.clients):
            for name, (_proc, base) in procs.items():
                if isinstance(results[name], list):
                    row = measure_level(name, base, c, args, first=i == 0, requests=quick_requests(args, c))
                    if isinstance(row, str):
                        results[name] = row
                    else:
                        results[name].append(row)
        if args.quick and "localllm serve" in procs:  # the paired section's grammar line on this server: one start less
            pair_lines = paired(args, path, log_dir, running=procs["localllm serve"])
    finally:
        for proc, _ in procs.values():
            stop_server(proc)
    run_eval, run_rate = run_decode(args, path)
    lines = [
        f"bench_serve: {Path(path).name}, prompt ~{args.prompt_tokens} tokens, {args.gen_tokens} generated per request (greedy, ignore_eos), "
        f"ctx {args.ctx} per sequence, {args.threads} threads, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"machine: {os.cpu_count()} CPUs shared with other jobs: figures are noisy, compare within one run only.",
        "",
        "| server | clients | reqs | errors | tok/s (all) | per-stream tok/s p50 | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.items():
        if isinstance(rows, str):
            lines.append(f"| {name} | {rows} | | | | | | | | |")
            continue
        for r in rows:
            lines.append(
                f"| {name} | {r['concurrency']} | {r['requests']} | {r['errors']} | {fmt(r['tokens_per_s'], '.2f')} | "
                f"{fmt(r['stream_tok_per_s_p50'], '.2f')} | "
                f"{fmt(r['ttft_p50_ms'])} ms | {fmt(r['ttft_p95_ms'])} ms | {fmt(r['itl_p50_ms'])} ms | {fmt(r['itl_p95_ms'])} ms |"
            )
    lines.append(f"| localllm run | 1 | | | | {fmt(run_rate, '.2f')} (1/TPOT; llama.cpp eval rate {fmt(run_eval, '.2f')}) | | | | |")

    def tps(server: str, c: int, key: str = "tokens_per_s"):
        rows = results.get(server)
        if isinstance(rows, list):
            for r in rows:
                if r["concurrency"] == c:
                    return r[key]
        return None

    lines.append("")
    top = max(args.clients)
    ours1, oursN = tps("localllm serve", 1), tps("localllm serve", top)
    lsN = tps("llama-server", top)
    stream1 = tps("localllm serve", 1, "stream_tok_per_s_p50")

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    checks = [
        (f"localllm serve: {top} clients / 1 client (target >= 2.5)", ratio(oursN, ours1), 2.5),
        (f"localllm serve / llama-server at {top} clients (target >= 0.9)", ratio(oursN, lsN), 0.9),
        ("localllm serve 1-client stream decode / localllm run 1/TPOT (target >= 0.95)", ratio(stream1, run_rate), 0.95),
        ("  the same against run's llama.cpp eval rate (decode time only, no sampling)", ratio(stream1, run_eval), 0.95),
    ]
    for label, value, target in checks:
        verdict = "n/a" if value is None else ("met" if value >= target else "NOT met")
        lines.append(f"- {label}: {fmt(value, '.2f')} ({verdict})")
    lines.extend(pair_lines if pair_lines is not None else paired(args, path, log_dir))
    lines.extend(embeddings(args))
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
