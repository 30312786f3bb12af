"""Adaptive decode threads against fixed counts, on an idle and a busy machine (issue 50).

In each of three conditions, localllm (threads chosen as it decodes) and
llama-bench (tg: the same model, the same number of one-token decode steps from
an empty context) run in turns, the order flipped each round:

- idle: nothing else started;
- busy: one child process spins on a core for the whole condition (a "hog");
- on-off: a hog that spins for ``--period`` seconds, then sleeps as long; its
  runs decode ``--on-off-tokens``, enough to span several periods on both
  sides of a pair: a run of 256 tokens at 30-90 t/s spans 1-3 periods of 3 s,
  so whether it started with the hog on or off swung a pair by 2x (measured).

llama-bench runs at its default threads (``-t`` left out: its count of the
machine's cores) and at each fixed count from 1 to the CPUs this process may use.
localllm's figure is its decode rate (decode + synchronize time per evaluated
token, the same span llama-bench times; sampling is not in it). The engine keeps
one loaded model for all conditions, as a long chat does, so its controller
follows the load as it changes.

Ratios (geometric mean of the rounds' pairs, with the 95% interval of
``paired_runs.interval``) against the targets:

- localllm adaptive / llama-bench at the best fixed count of that condition >= 0.97;
- localllm adaptive / llama-bench at its default threads, one core busy >= 1.4;
- and, not a target, localllm adaptive / localllm fixed at the best count: the
  cost of exploring without the two programs' other differences;
- serve (adaptive) / llama-server at its default threads, one core busy, at 1
  and 8 clients >= 1.3 (scripts/contention_serve.py; ``--no-serve`` skips it).

On a shared machine the other load hits both sides of a pair alike; the
figures are still noisy: read the intervals. ``--quick``: one round of 2
tokens, a short period: it shows the script runs and prints its lines, not the
ratios (a run with more threads than free cores can fall to a few t/s or
less: the quick run's time is in its tokens).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.engine_api import LoadConfig, SamplingConfig  # noqa: E402
from localllm.store.resolver import resolve  # noqa: E402
from localllm.threads.topology import allowed_cpus  # noqa: E402
from scripts.llama_tools import FIX, tool  # noqa: E402
from scripts.paired_runs import interval, verdict_line  # noqa: E402

IDLE_TARGET = 0.97
BUSY_DEFAULT_TARGET = 1.4


def _spin() -> None:
    while True:
        pass


def _on_off(period: float) -> None:
    while True:
        end = time.monotonic() + period
        while time.monotonic() < end:
            pass
        time.sleep(period)


class Hog:
    """A child process that takes a core (``period``: on and off in turns), for one condition."""

    def __init__(self, period: float | None) -> None:
        self.period = period
        self.proc: multiprocessing.process.BaseProcess | None = None

    def __enter__(self) -> Hog:
        ctx = multiprocessing.get_context("spawn")
        target: Callable[..., None] = _spin if self.period is None else _on_off
        self.proc = ctx.Process(target=target, args=() if self.period is None else (self.period,), daemon=True)
        self.proc.start()
        time.sleep(0.2)  # spawned and spinning
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()


def llama_bench(path: Path, n_gen: int, threads: int | None, warmup: bool = True) -> float | str:
    """tg ``n_gen`` tokens/s from llama-bench (one repetition, after its warm-up run unless not ``warmup``), or why not."""
    exe = tool("llama-bench")
    if not exe.exists():
        return f"not run ({exe} missing: {FIX})"
    cmd = [str(exe), "-m", str(path), "-p", "0", "-n", str(n_gen), "-r", "1", "-o", "json"]
    if threads is not None:
        cmd += ["-t", str(threads)]
    if not warmup:
        cmd.append("--no-warmup")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        return float(next(x["avg_ts"] for x in json.loads(r.stdout) if x["n_gen"]))
    except (ValueError, KeyError, StopIteration, TypeError):
        return "failed: " + ((r.stderr.strip().splitlines() or ["no output"])[-1][:200])


def ours(backend, n_gen: int) -> float:
    """localllm's decode rate for ``n_gen`` tokens from an empty context."""
    first = backend.bos_token() or 0
    with backend.stream([first], SamplingConfig(temperature=0.0, max_tokens=n_gen, ignore_eos=True), chat=False) as gen:
        for _ in gen:
            pass
    assert gen.stats is not None and gen.stats.decode_tokens_per_s is not None
    return float(gen.stats.decode_tokens_per_s)


def plain_line(label: str, ratios: list[float], missing: str) -> str:
    """A ratio with no target: its mean, pairs and interval, no verdict."""
    if not ratios:
        return f"- {label}: n/a ({missing})"
    band = interval(ratios)
    spread = f" 95% interval {band[0]:.3f}-{band[1]:.3f}" if band else ""
    return f"- {label}: {statistics.geometric_mean(ratios):.3f} [pairs: {', '.join(f'{r:.3f}' for r in ratios)}]{spread}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="one round of 2 tokens, a 0.5 s period, no warm-up runs nor localllm at fixed counts: it runs, the figures are noise")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=256, help="decode steps a run (default 256)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per condition, the order flipped each (default 5)")
    ap.add_argument("--period", type=float, default=2.0, help="the on-off hog's seconds on, then off (default 2)")
    ap.add_argument("--on-off-tokens", type=int, default=768, help="decode steps a run with the on-off hog (default 768: several periods)")
    ap.add_argument("--no-local-fixed", action="store_true", help="skip localllm at fixed counts (the exploring cost line)")
    ap.add_argument("--no-serve", action="store_true", help="skip serve against llama-server with one core busy")
    ap.add_argument("--only", choices=("idle", "busy", "on-off"), action="append", help="run only this condition (repeatable; default: all three)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.on_off_tokens, args.rounds, args.period, args.no_local_fixed = 2, 2, 1, 0.5, True
    from localllm.engine import LlamaCppBackend  # lazy: loads llama.cpp, after the flags are checked

    path = resolve(args.model)
    cpus = len(allowed_cpus())
    counts = list(range(1, cpus + 1))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"model {path.name}, {args.tokens} tokens a run, {args.rounds} round(s), {cpus} CPU(s) for this process, "
          f"load average {'n/a' if load is None else f'{load:.2f}'} at start")
    adaptive = LlamaCppBackend()
    n_ctx = max(512, args.tokens + 64, args.on_off_tokens + 64)
    adaptive.load(path, LoadConfig(n_ctx=n_ctx))
    fixed_local = {} if args.no_local_fixed else {k: LlamaCppBackend() for k in counts}
    for k, b in fixed_local.items():
        b.load(path, LoadConfig(n_ctx=n_ctx, n_threads=k))
    ctl = adaptive.threads
    assert ctl is not None
    print(f"localllm starts at {ctl.start} thread(s): {ctl.why}")
    lines: list[str] = []
    try:
        conditions = (("idle", None, "idle"), ("one core busy", 0.0, "busy"), ("hog on and off", args.period, "on-off"))
        for name, period in [(n, p) for n, p, key in conditions if not args.only or key in args.only]:
            rows: dict[str, list[float]] = {}
            failed: dict[str, str] = {}
            first = len(lines)
            mark = len(ctl.changes)
            hog = Hog(None if period == 0.0 else period) if period is not None else None
            n_gen = args.on_off_tokens if period else args.tokens
            if hog is not None:
                hog.__enter__()
            try:
                for r in range(args.rounds):
                    sides: list[tuple[str, Callable[[], float | str]]] = [("localllm adaptive", lambda n=n_gen: ours(adaptive, n))]
                    sides += [(f"localllm -t {k}", lambda b=b, n=n_gen: ours(b, n)) for k, b in fixed_local.items()]
                    sides += [("llama-bench default", lambda n=n_gen: llama_bench(path, n, None, not args.quick))]
                    sides += [(f"llama-bench -t {k}", lambda k=k, n=n_gen: llama_bench(path, n, k, not args.quick)) for k in counts]
                    for label, fn in sides if r % 2 == 0 else list(reversed(sides)):
                        got = fn()
                        if isinstance(got, str):
                            failed[label] = got
                        else:
                            rows.setdefault(label, []).append(got)
            finally:
                if hog is not None:
                    hog.__exit__()
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            print(f"\n{name}: tokens/s, median of {args.rounds} run(s); load average {'n/a' if load is None else f'{load:.2f}'} at its end")
            for label, xs in rows.items():
                print(f"  {label:<22}{statistics.median(xs):>9.1f}")
            for label, why in failed.items():
                print(f"  {label:<22} n/a ({why})")
            moves = [c.line() for c in ctl.changes[mark:] if c.kind == "token"]
            print(f"  localllm's one-token count moved {len(moves)} time(s)" + (f"; last: {moves[-1]}" if moves else ""))
            ad = rows.get("localllm adaptive", [])
            bench_fixed = {k: rows[f"llama-bench -t {k}"] for k in counts if len(rows.get(f"llama-bench -t {k}", [])) == len(ad)}
            if bench_fixed:
                best = max(bench_fixed, key=lambda k: statistics.geometric_mean(bench_fixed[k]))
                ratios = [a / b for a, b in zip(ad, bench_fixed[best])]
                lines.append(verdict_line(f"{name}: localllm adaptive / llama-bench at the best fixed count (-t {best}) (target >= {IDLE_TARGET})",
                                          ratios, IDLE_TARGET))
            else:
                lines.append(verdict_line(f"{name}: localllm adaptive / llama-bench at the best fixed count (target >= {IDLE_TARGET})", [], IDLE_TARGET,
                                          failed.get("llama-bench -t 1", "llama-bench gave no figure")))
            default = rows.get("llama-bench default", [])
            pairs = [a / b for a, b in zip(ad, default)] if len(default) == len(ad) else []
            why = failed.get("llama-bench default", "llama-bench gave no figure")
            label = f"{name}: localllm adaptive / llama-bench at its default threads"
            if name == "one core busy":
                lines.append(verdict_line(f"{label} (target >= {BUSY_DEFAULT_TARGET})", pairs, BUSY_DEFAULT_TARGET, why))
            else:
                lines.append(plain_line(f"{label} (no target)", pairs, why))
            local = {k: rows[f"localllm -t {k}"] for k in fixed_local if f"localllm -t {k}" in rows}
            if local:
                best_local = max(local, key=lambda k: statistics.geometric_mean(local[k]))
                label = f"{name}: localllm adaptive / localllm fixed at the best count (-t {best_local}): exploring's cost"
                own = [a / b for a, b in zip(ad, local[best_local])]
                # issue 50 bounds exploring's cost on an idle machine; under a load it also pays for following it
                lines.append(verdict_line(f"{label} (target >= {IDLE_TARGET})", own, IDLE_TARGET) if period is None
                             else plain_line(f"{label} and following the load (no target)", own, "no pairs"))
            for line in lines[first:]:  # as each condition ends: a long run cut short keeps what it measured
                print(f"  {line[2:]}", flush=True)
    finally:
        adaptive.close()
        for b in fixed_local.values():
            b.close()
    if not args.no_serve:
        from scripts.contention_serve import serve_rows

        print("\none core busy, serve against llama-server: aggregate tokens/s", flush=True)
        if args.quick:  # it runs and prints its line: 8 clients once each, short prompts and replies, no warm-up
            lines += serve_rows(path, tool("llama-server"), lambda: Hog(None), rounds=1, gen_tokens=2, clients=(8,), prompt_tokens=8, warmup=False,
                                requests=8)
        else:
            lines += serve_rows(path, tool("llama-server"), lambda: Hog(None), rounds=max(2, args.rounds), gen_tokens=args.tokens)
    print("\nRatios, geometric mean of the rounds' pairs with their 95% interval:")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
