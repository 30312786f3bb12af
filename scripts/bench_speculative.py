"""Draftless speculation side by side in one run: localllm without it
(``--speculate none``), with it (``auto``, the default), and llama-server with
``--spec-type ngram-mod`` and without, on the same model, threads and prompts.

Two tasks: quoting-heavy (rewrite a ~600-token code file with one change,
greedy, as a coding agent asks) and free text (a story, llama.cpp's default
sampler, seeded). The figure is the decode rate: the reply's tokens after the
first over the time from the first token to the last (each side's own clock:
localllm's token stamps, llama-server's ``timings.predicted_per_second``).
Prints the ratios the targets are about: auto over none (>= 1.5 quoting,
>= 0.97 free text) and auto over llama-server ngram-mod, medians of paired,
alternating runs, and the first run of each (before either side remembers the
reply: llama-server's ngram-mod pool is shared across requests, as localllm's
earlier replies are). ``ceiling`` is the most any drafter can give here: every
draft of 64 kept whole, a 65-row batch's cost against one token's. ``index``
is what each request pays before its first token to index its prompt for
drafting, on the JSON text of a captured Claude Code request (tests/serve/captured/).

    python scripts/bench_speculative.py [--model smollm2] [--reps 3] [--tokens 256] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.engine import LlamaCppBackend  # noqa: E402
from localllm.engine_api import LoadConfig, SamplingConfig  # noqa: E402
from localllm.speculation import NgramIndex, rows  # noqa: E402
from localllm.store import resolver  # noqa: E402
from scripts.llama_tools import tool  # noqa: E402

CODE = Path(__file__).resolve().parents[1] / "localllm" / "speculation" / "control.py"
CAPTURED = Path(__file__).resolve().parents[1] / "tests" / "serve" / "captured" / "claude_code_2.1.332_all_tools.json"
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def tasks(source: str) -> dict[str, tuple[str, float]]:
    """name: (prompt, temperature)."""
    return {
        "quoting (rewrite a code file, one change)": (
            "Rewrite this Python file exactly as it is, except that the constant WINDOW becomes 48. Output only the file.\n\n" + source, 0.0),
        "free text (a story)": (FREE, 0.8),
    }


def ours(b: LlamaCppBackend, prompt: str, temp: float, n: int, mode: str) -> tuple[float | None, float | None]:
    """(decode tokens/s, acceptance) of one reply."""
    gen = b.stream(prompt, SamplingConfig(temperature=temp, seed=42, max_tokens=n, ignore_eos=True, speculate=mode))
    stamps = [e.t_ns for e in gen]
    rate = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9) if len(stamps) > 1 and stamps[-1] > stamps[0] else None
    return rate, gen.spec.acceptance if gen.spec is not None else None


def index_ms(b: LlamaCppBackend, reps: int) -> dict[str, float]:
    """Milliseconds to index an agent's prompt (the median of ``reps``, at least 5): paid on
    serve's scheduler thread, or before the engine's first token, at every request."""
    tokens = b.tokenize(CAPTURED.read_text(), add_special=False, parse_special=False)
    took = []
    for _ in range(max(reps, 5)):
        t0 = time.perf_counter()
        NgramIndex(tokens)
        took.append((time.perf_counter() - t0) * 1e3)
    return {"tokens": len(tokens), "ms": statistics.median(took)}


def ceiling(b: LlamaCppBackend, prompt: str, reps: int) -> dict[str, float]:
    """The most any draft of up to ``rows("auto") - 1`` tokens can give here: every draft kept
    whole, so each batch of ``n`` rows gives ``n`` tokens, against one-token decodes, at the
    quoting prompt's depth (fastest of ``reps``). Where a batch's rows cost nearly what a token
    does (a small model on a CPU: compute-bound), this bounds every draftless drafter alike,
    llama-server's included."""
    n = rows("auto") or 1
    toks = b.tokenize(prompt)
    b.reset()
    b.prefill(toks)
    one, many = [], []
    for _ in range(reps):
        one.append(b.verify(toks[-1:]).ns)
        b.truncate(len(toks))
        many.append(b.verify((toks * (1 + n // len(toks)))[:n]).ns)
        b.truncate(len(toks))
    t1, tn = min(one), min(many)
    return {"rows": n, "ms_one_token": t1 / 1e6, "ms_a_row": tn / 1e6 / n, "x_none": n * t1 / tn}


class LlamaServer:
    def __init__(self, binary: Path, model: Path, ctx: int, threads: int, spec: bool, port: int) -> None:
        cmd = [str(binary), "-m", str(model), "--port", str(port), "-c", str(ctx), "-np", "1", "-t", str(threads), "--no-warmup"]
        if spec:
            cmd += ["--spec-type", "ngram-mod"]
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        import httpx2 as httpx

        self.http = httpx.Client(timeout=600)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {(self.proc.stderr.read() if self.proc.stderr else '')[-400:]}")
            try:
                if self.http.get(f"{self.base}/health").status_code == 200:
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.3)
        raise RuntimeError("llama-server did not start in 120 s")

    def rate(self, prompt: str, temp: float, n: int) -> tuple[float | None, float | None]:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": temp, "seed": 42, "ignore_eos": True,
                "cache_prompt": False}
        t = self.http.post(f"{self.base}/v1/chat/completions", json=body).json()["timings"]
        drafted, kept = t.get("draft_n"), t.get("draft_n_accepted")
        return t.get("predicted_per_second"), (kept / drafted if drafted else None)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.http.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="one repetition, few tokens, no llama-server (CI: it completes and prints its figures)")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.tokens = 1, 16
    path = resolver.resolve(a.model)
    source = CODE.read_text()[:800 if a.quick else 2400]  # about 600 tokens of code (quick: 200, it only has to run)
    b = LlamaCppBackend()
    b.load(path, LoadConfig(n_ctx=4096, n_outputs_max=rows("auto") or 1, n_threads=a.threads))
    binary = tool("llama-server")
    servers: dict[str, LlamaServer] = {}
    missing = "not run (--quick)" if a.quick else None
    if not a.quick:
        if binary.is_file():
            servers = {"llama-server": LlamaServer(binary, path, 4096, a.threads, False, 18511),
                       "llama-server ngram-mod": LlamaServer(binary, path, 4096, a.threads, True, 18512)}
        else:
            missing = f"not built ({binary} missing)"
    report: dict[str, dict] = {}
    try:
        bound = ceiling(b, tasks(source)["quoting (rewrite a code file, one change)"][0], a.reps)
        index = index_ms(b, a.reps)
        for name, (prompt, temp) in tasks(source).items():
            runs: dict[str, list[tuple[float | None, float | None]]] = {k: [] for k in ("none", "auto", *servers)}
            for r in range(a.reps):
                order = list(runs) if r % 2 == 0 else list(reversed(runs))
                for k in order:
                    runs[k].append(servers[k].rate(prompt, temp, a.tokens) if k in servers else ours(b, prompt, temp, a.tokens, k))
            med = {k: statistics.median(x[0] for x in v if x[0]) if any(x[0] for x in v) else None for k, v in runs.items()}
            acc = {k: statistics.median(x[1] for x in v if x[1] is not None) if any(x[1] is not None for x in v) else None
                   for k, v in runs.items()}
            ngram = med.get("llama-server ngram-mod")
            ratio = {"auto/none": med["auto"] / med["none"] if med["auto"] and med["none"] else None,
                     "ceiling/none": bound["x_none"],
                     "ceiling/llama-server ngram-mod": bound["x_none"] * med["none"] / ngram if med["none"] and ngram else None,
                     "auto/llama-server ngram-mod": (med["auto"] / med["llama-server ngram-mod"]
                                                     if med["auto"] and med.get("llama-server ngram-mod") else None)}
            # the first repetition: nothing remembered on either side (llama-server's ngram-mod pool
            # and localllm's earlier replies hold the repeated request's reply from the second on)
            first = {k: v[0][0] for k, v in runs.items()}
            report[name] = {"temperature": temp, "tokens_per_s": med, "acceptance": acc, "ratios": ratio, "first_request": first}
    finally:
        for s in servers.values():
            s.close()
        b.close()
    if a.json:
        print(json.dumps({"model": path.name, "threads": a.threads, "tokens": a.tokens, "reps": a.reps, "llama_server": missing or "run",
                          "ceiling": bound, "index": index, "tasks": report}, indent=2))
        return 0
    print(f"{path.name}, {a.threads} threads, {a.tokens} tokens a reply, median of {a.reps} (decode tokens/s; acceptance)")
    print(f"  ceiling: a {bound['rows']}-row batch {bound['ms_a_row']:.1f} ms a row, one token {bound['ms_one_token']:.1f} ms:"
          f" drafts kept whole give at most x{bound['x_none']:.2f} against none here")
    print(f"  index: Claude Code's request, {index['tokens']:,} tokens, indexed for drafting in {index['ms']:.1f} ms (each request, before its first token)")
    for name, rp in report.items():
        print(f"  {name}, temperature {rp['temperature']}:")
        for k, v in rp["tokens_per_s"].items():
            acc = rp["acceptance"].get(k)
            print(f"    {k:<24} {'n/a' if v is None else f'{v:7.1f}'}" + ("" if acc is None else f"   {100 * acc:.0f}% of drafts kept"))
        if missing:
            print(f"    llama-server             {missing}")
        f = rp["first_request"]
        if f.get("llama-server ngram-mod") and f.get("auto"):
            print(f"    first request (nothing remembered): auto {f['auto']:.1f}, llama-server ngram-mod"
                  f" {f['llama-server ngram-mod']:.1f} (x{f['auto'] / f['llama-server ngram-mod']:.2f})")
        for k, v in rp["ratios"].items():
            print(f"    {k:<32} {'n/a' if v is None else f'x{v:.2f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
