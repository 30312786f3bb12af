"""Claude Code's first request on ``localllm serve`` against llama-server (issue 59,
item 7), side by side in one run.

The request is the one Claude Code 2.1.332 sends for ``claude -p "Say hello"``
with its tool search off (22 tools), captured in ``tests/serve/captured/``. Each
server renders it with its own template code, and they differ (llama-server's
``/v1/messages`` left Gemma 3's prompt at 3,628 tokens where serve renders
22,136: llama-server's generic tool format for a template without tools is not
serve's), so the times are compared on the same tokens: serve's rendering of the
request (the tools in a system message, the turns as serve writes them for a
model without a chat template, which Gemma 3 270M is) is sent as text to each server's ``/completion`` with ``n_predict`` 1, and the time to its
answer is the TTFT (llama-server ``--jinja``, the same model, context and
threads, one slot). Both servers' ``/v1/messages/count_tokens`` for the request
itself are printed beside. Each round opens the prompt with a line of its own,
so each first request reads its whole prompt; the servers take turns, the order
flipping each round. Then, per server, a second request with the same prefix and
one more turn (a reply and a new question, Claude Code's next step): its time
over the first's shows the prompt cache.

Targets: serve's first-request speed >= 0.95x llama-server's (the ratio of
llama-server's time to serve's, geometric mean of the rounds with its 95%
interval), and serve's second request <= 0.1x its first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.llama_tools import tool  # noqa: E402
from scripts.paired_runs import free_port, start_server, stop_server, verdict_line, wait_ready  # noqa: E402

CAPTURED = REPO / "tests" / "serve" / "captured" / "claude_code_2.1.332_all_tools.json"


def claude_code_body() -> dict:
    return json.loads(CAPTURED.read_text(encoding="utf-8"))["body"]


def rendered(path: str) -> str:
    """Claude Code's request as serve's ``/v1/messages`` renders it: translated and
    checked as serve does (the tools in a system message for a template without
    tools), then, Gemma 3 270M being a base model with no chat template, the
    turns as serve writes them for such a model (commands/serve.py, ``_tokenizer``)."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.serve import anthropic, tools
    from localllm.serve.protocol import parse_gen

    out, _ = anthropic.translate(claude_code_body())
    template = read_header(path).get("tokenizer.chat_template")
    if template:
        raise SystemExit(f"bench_claude_code: {path} has a chat template; this bench renders only a base model's prompt")
    params = parse_gen(out, chat=True, n_vocab=262_144, tool_format=tools.detect(""))
    return "".join(f"{m['role']}: {m['content']}\n" for m in params.messages or []) + "assistant:"


def post(base: str, prompt: str) -> tuple[float, int]:
    """(seconds to the answer of one token, prompt tokens the server counted)."""
    import httpx2

    t0 = time.perf_counter()
    r = httpx2.post(base + "/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}, timeout=1800)
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took, int(r.json()["tokens_evaluated"])


def counted(base: str) -> int | None:
    """The server's own ``/v1/messages/count_tokens`` of Claude Code's request (None: it has no such route)."""
    import httpx2

    body = claude_code_body()
    body.pop("stream", None)
    r = httpx2.post(base + "/v1/messages/count_tokens", json=body, timeout=300, headers={"x-api-key": "none"})
    return r.json().get("input_tokens") if r.status_code == 200 else None


FOLLOW_UP = " Hello! How can I help?\nuser: List the files here.\nassistant:"  # the next turn, written as serve writes turns (above)


def main(argv: list[str] | None = None) -> int:
    from localllm.plan.hardware import physical_cores
    from localllm.store.resolver import resolve

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each server once a round (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--quick", action="store_true", help="CI: a short prompt, one round, llama-server not run (the figures are noise)")
    args = ap.parse_args(argv)

    path = str(resolve("gemma3-270m"))
    ctx = 4096 if args.quick else 32768
    rounds = 1 if args.quick else args.rounds
    log_dir = Path("/tmp") / "bench_claude_code_logs"
    log_dir.mkdir(exist_ok=True)
    binary = tool("llama-server")
    cmds = {"serve": lambda port: [sys.executable, "-m", "localllm", "serve", path, "--port", str(port), "--parallel", "1", "--ctx", str(ctx),
                                   "--threads", str(args.threads)]}
    if not args.quick and binary.exists():
        cmds["llama-server"] = lambda port: [str(binary), "-m", path, "--port", str(port), "-np", "1", "-c", str(ctx), "--jinja",
                                             "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"]
    first: dict[str, list[float]] = {name: [] for name in cmds}
    second: dict[str, list[float]] = {name: [] for name in cmds}
    tokens: dict[str, int] = {}
    counts: dict[str, int | None] = {}
    # --quick: the prompt's first ~350 tokens (its 6,000 characters took 8 of the run's 12 s to prefill on one thread)
    prompt = rendered(path)[:1500] if args.quick else rendered(path)
    for r in range(rounds):
        for name in list(cmds)[:: 1 if r % 2 == 0 else -1]:
            port = free_port()
            proc, base = start_server(f"{name}_{r}", cmds[name](port), port, log_dir)
            try:
                wait_ready(proc, base)
                if name not in counts:
                    counts[name] = counted(base)
                print(f"  round {r + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
                mine = f"Session {r}.\n" + prompt
                took, tokens[name] = post(base, mine)
                first[name].append(took)
                second[name].append(post(base, mine + FOLLOW_UP)[0])
            finally:
                stop_server(proc)
    lines = [f"bench_agents --claude-code: {Path(path).name}, Claude Code 2.1.332's first request as serve renders it, context {ctx}, "
             f"{args.threads} threads, {rounds} round(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| server | its count_tokens of the request | tokens read (/completion) | first request (median s) | second, same prefix (median s) "
             "| second / first |", "|---|---|---|---|---|---|"]
    for name in cmds:
        a, b = statistics.median(first[name]), statistics.median(second[name])
        lines.append(f"| {name} | {counts.get(name) if counts.get(name) is not None else 'n/a'} | {tokens[name]} | {a:.2f} | {b:.3f} | {b / a:.4f} |")
    lines.append("")
    ratios = [ls / ours for ours, ls in zip(first["serve"], first.get("llama-server", []))]
    missing = "llama-server not run (--quick)" if args.quick else f"llama-server not built ({binary} missing)"
    lines.append(verdict_line("first-request TTFT speed, serve / llama-server (target >= 0.95)", ratios, 0.95, missing))
    cached = [b / a for a, b in zip(first["serve"], second["serve"])]
    worst = max(cached)
    lines.append(f"- serve's second request / its first (prompt cache; target <= 0.1): {worst:.4f} "
                 f"({'met' if worst <= 0.1 else 'NOT met'}, the worst of {len(cached)} round(s))")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
