"""A tool round trip's overhead on ``localllm serve`` (issue 48, "Tests and
figures"): its extra time to first token against the same conversation
without tools, and proof that it re-reads none of the history.

Each round sends four requests on one sequence (``--parallel 1``, so the
second request of a pair finds the first's tokens in the prefix cache):

- without tools: a question, then its second turn (the answer and a follow-up);
- with tools: the same question with two tools offered and a forced call
  (``tool_choice`` required: the grammar writes it), then the round trip: the
  call and its result sent back (``tool_choice`` auto, as a client continues).

TTFT is the server's ``timings.prompt_ms`` (the prompt read, to the first
token). The first pair's difference is the tools' cost: their descriptions'
prefill and the grammar. The round trip's ``timings`` show what it evaluated:
``cache_n`` covers the first request's whole prompt (no history re-prefilled)
and ``prompt_n`` is only the new tokens, the call as the template renders it,
the result and the generation prompt. On SmolLM2 (no tool format of its own:
the generic one, tools described in the system message).

    python scripts/bench_tools.py [--model smollm2] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.plan.hardware import physical_cores  # noqa: E402
from scripts.paired_runs import free_port, serve_cmd, start_server, stop_server, wait_ready  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city, in Celsius or Fahrenheit",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24, "description": "The city's name"},
                                                    "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "local_time", "description": "The local time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                                                        "required": ["city"]}}}
QUESTION = "What is the weather in Paris right now?"
RESULT = '{"city": "Paris", "temperature": 21, "unit": "C", "sky": "sunny"}'


def _post(client, base: str, body: dict) -> dict:
    r = client.post(base + "/v1/chat/completions", json={"model": "m", "temperature": 0, **body})
    r.raise_for_status()
    return r.json()


def one_round(client, base: str, r: int, gen: int) -> dict[str, dict]:
    """The four requests of round ``r``: each one's timings, usage and reply."""
    out: dict[str, dict] = {}
    plain_sys = {"role": "system", "content": f"Round {r}, plain. You are a helpful assistant."}
    tool_sys = {"role": "system", "content": f"Round {r}, tools. You are a helpful assistant."}  # another prefix: read cold
    ask = {"role": "user", "content": QUESTION}
    out["plain1"] = _post(client, base, {"messages": [plain_sys, ask], "max_tokens": gen})
    answer = out["plain1"]["choices"][0]["message"]["content"] or ""
    out["plain2"] = _post(client, base, {"messages": [plain_sys, ask, {"role": "assistant", "content": answer},
                                                      {"role": "user", "content": "The weather service says: " + RESULT}], "max_tokens": gen})
    out["tools1"] = _post(client, base, {"messages": [tool_sys, ask], "tools": [WEATHER, TIME], "tool_choice": "required",
                                         "parallel_tool_calls": False, "max_tokens": 64})
    calls = out["tools1"]["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        raise RuntimeError(f"round {r}: the forced call did not come back: {out['tools1']['choices'][0]}")
    out["tools2"] = _post(client, base, {"messages": [tool_sys, ask, {"role": "assistant", "content": None, "tool_calls": calls[:1]},
                                                      {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}],
                                         "tools": [WEATHER, TIME], "tool_choice": "auto", "max_tokens": gen})
    return out


def _median(rows: list[dict[str, dict]], key: str, field: str, part: str = "timings") -> float:
    return statistics.median(float(row[key][part][field]) for row in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--quick", action="store_true", help="CI: one round, 8 tokens, no warm-up (the figures are noise)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.gen_tokens = 1, 8
    from localllm.store.resolver import resolve

    path = str(resolve(args.model))
    log_dir = Path("/tmp") / "bench_tools_logs"
    log_dir.mkdir(exist_ok=True)
    port = free_port()
    proc, base = start_server("localllm-serve", serve_cmd(path, port, 1, 4096, args.threads), port, log_dir)
    rows: list[dict[str, dict]] = []
    try:
        wait_ready(proc, base)
        import httpx2

        with httpx2.Client(timeout=300) as client:
            if not args.quick:  # quick: the figures are noise anyway, and the warm-up was half its time
                one_round(client, base, -1, 4)  # warm-up: the first request's one-time costs (the grammar converter's import)
            for r in range(args.rounds):
                print(f"  round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
                rows.append(one_round(client, base, r, args.gen_tokens))
    finally:
        stop_server(proc)
    last = rows[-1]
    p1, t1 = last["plain1"]["usage"]["prompt_tokens"], last["tools1"]["usage"]["prompt_tokens"]
    rt = last["tools2"]
    rt_prompt, rt_cached, rt_new = rt["usage"]["prompt_tokens"], rt["timings"]["cache_n"], rt["timings"]["prompt_n"]
    reread = max(0, t1 - rt_cached)  # the first request's prompt that the round trip read again
    plain_ttft1, tools_ttft1 = _median(rows, "plain1", "prompt_ms"), _median(rows, "tools1", "prompt_ms")
    plain_ttft2, tools_ttft2 = _median(rows, "plain2", "prompt_ms"), _median(rows, "tools2", "prompt_ms")
    lines = [f"bench_tools: {Path(path).name}, --parallel 1, greedy, {args.threads} threads, median of {args.rounds} round(s), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| request | without tools: TTFT ms | prompt tokens (evaluated) | with tools: TTFT ms | prompt tokens (evaluated) |",
             "|---|---|---|---|---|",
             f"| question | {plain_ttft1:.1f} | {p1} ({last['plain1']['timings']['prompt_n']}) | {tools_ttft1:.1f} | "
             f"{t1} ({last['tools1']['timings']['prompt_n']}) |",
             f"| second turn / round trip | {plain_ttft2:.1f} | {last['plain2']['usage']['prompt_tokens']} "
             f"({last['plain2']['timings']['prompt_n']}) | {tools_ttft2:.1f} | {rt_prompt} ({rt_new}) |", "",
             f"tool descriptions: +{t1 - p1} prompt tokens; question TTFT with tools - without: {tools_ttft1 - plain_ttft1:+.1f} ms "
             f"(TTFT per evaluated token: {plain_ttft1 / max(1, last['plain1']['timings']['prompt_n']):.1f} ms without tools, "
             f"{tools_ttft1 / max(1, last['tools1']['timings']['prompt_n']):.1f} ms with: the extra is their prefill)",
             f"tool round trip's extra TTFT (question + result) against the same turns without tools: "
             f"{tools_ttft1 + tools_ttft2 - plain_ttft1 - plain_ttft2:+.1f} ms",
             f"round trip: evaluated {rt_new} new tokens of {rt_prompt} (cache_n {rt_cached}); "
             f"history re-prefilled: {reread} of the first request's {t1} tokens (target 0)"]
    print("\n".join(lines))
    return 0 if reread == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
