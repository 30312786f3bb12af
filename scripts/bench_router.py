"""A model switch through ``localllm serve``'s router against llama-server's router (issue 46).

Both routers serve the same two files (SmolLM2 and gemma3-270m), ``--models-max 1``,
the same ``--ctx``, ``--parallel 1`` and ``--threads``. A switch: with model A loaded
and a short greedy request to A just answered, a streamed request naming B is timed
from sending to its first streamed token (unload A, load B, prefill, first token).
Directions alternate (A->B, B->A) and so do the routers (which goes first in a
pair), and each pair gives a ratio localllm/llama-server (target <= 1.1).

Then steady decode: each model's tokens/s over a greedy streamed reply through the
router against the same model under ``localllm serve MODEL`` (same options), in
alternating turns, proxying between processes included (target >= 0.97).

Ratios are geometric means of the pairs with bench_serve's 95% interval; --quick
(one switch a router, one decode pair of 4 tokens, no warm-up) prints them "(not judged)".

    python scripts/bench_router.py [--quick] [--pairs N] [--threads N]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.llama_tools import require  # noqa: E402
from scripts.paired_runs import free_port, interval, start_server, stop_server, wait_ready  # noqa: E402

PROMPT = "1, 2, 3, 4, 5,"
MODELS = ("smollm2", "gemma3-270m")


def model_files() -> dict[str, Path]:
    """The two built-in models' files (gemma3-270m assembled on first use, as the code does)."""
    from localllm.store.builtin import find_entry, path_of

    out = {}
    for name in MODELS:
        entry = find_entry(name)
        assert entry is not None, name
        out[name] = path_of(entry)
    return out


def stream(base: str, model: str, tokens: int, timeout: float = 180) -> tuple[float, list[float]]:
    """A greedy streamed /v1/completions: (seconds from sending to the first token, each token's arrival time)."""
    host, _, port = base.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{base} {model}: HTTP {resp.status} {resp.read()[:300]!r}")
    arrivals: list[float] = []
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        choices = chunk.get("choices") or []
        if choices and choices[0].get("text"):
            arrivals.append(time.perf_counter())
    conn.close()
    if not arrivals:
        raise RuntimeError(f"{base} {model}: no token streamed")
    return arrivals[0] - t0, arrivals


def decode_rate(base: str, model: str, tokens: int) -> float:
    _, arrivals = stream(base, model, tokens)
    if len(arrivals) < 3:
        raise RuntimeError(f"{base} {model}: only {len(arrivals)} tokens streamed")
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def switch_time(base: str, a: str, b: str) -> float:
    stream(base, a, 4)  # A loaded, a request to it just finished
    first, _ = stream(base, b, 4)
    return first


def ratio_line(label: str, ratios: list[float], target: float, at_most: bool, judged: bool) -> str:
    if not ratios:
        return f"{label}: n/a"
    mean = statistics.geometric_mean(ratios)
    band = interval(ratios)
    spread = f" [{band[0]:.2f}-{band[1]:.2f}]" if band else " [n/a]"
    sign = "<=" if at_most else ">="
    if not judged:
        verdict = "not judged"
    else:
        ok_mean = mean <= target if at_most else mean >= target
        ok_band = band is not None and (band[1] <= target if at_most else band[0] >= target)
        verdict = "met" if ok_band else ("not shown: the interval spans the target" if ok_mean else "NOT met")
    return f"{label}: {mean:.2f}{spread} (target {sign} {target}) ({verdict})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one switch a router, one decode pair of 4 tokens, no warm-up; figures not judged (CI)")
    ap.add_argument("--pairs", type=int, default=6, help="pairs per ratio (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="threads for every server (default: %(default)s)")
    ap.add_argument("--ctx", type=int, default=256, help="context per sequence (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=None, help="decode reply length (default: 64; --quick 4)")
    args = ap.parse_args()
    pairs = 1 if args.quick else max(2, args.pairs)
    tokens = args.tokens or (4 if args.quick else 64)  # decode_rate needs 3
    judged = not args.quick and pairs >= 2

    llama_server = require("llama-server")
    files = model_files()
    t = str(args.threads)
    opts = ["--ctx", str(args.ctx), "--parallel", "1", "--threads", t]
    with tempfile.TemporaryDirectory(prefix="bench_router-") as tmp:
        tmpd = Path(tmp)
        models_dir = tmpd / "models"
        models_dir.mkdir()
        ls_names = {}
        for name, path in files.items():
            (models_dir / path.name).symlink_to(path)
            ls_names[name] = path.stem  # llama-server names a model by its file stem
        procs = []
        try:
            lp, ll = free_port(), free_port()
            router = start_server("localllm-router", [sys.executable, "-m", "localllm", "serve", "--models", ",".join(MODELS), "--models-max", "1",
                                                      "--port", str(lp), *opts], lp, tmpd)
            procs.append(router[0])
            lsr = start_server("llama-server-router", [str(llama_server), "--models-dir", str(models_dir), "--models-max", "1", "--port", str(ll),
                                                       "-c", str(args.ctx), "-np", "1", "-t", t, "-tb", t, "--no-webui"], ll, tmpd)
            procs.append(lsr[0])
            singles = {}
            for name, path in files.items():
                port = free_port()
                s = start_server(f"serve-{name}", [sys.executable, "-m", "localllm", "serve", str(path), "--alias", name, "--port", str(port), *opts],
                                 port, tmpd)
                procs.append(s[0])
                singles[name] = s
            for proc, base in [router, lsr, *singles.values()]:
                wait_ready(proc, base)
            lbase, sbase = router[1], lsr[1]

            # switches: warm each router up on both models once (files in the page cache), then time;
            # --quick: no warm-up and one switch a router (it checks that the figures come, not what they are)
            a, b = MODELS
            for base, names in ((lbase, {m: m for m in MODELS}), (sbase, ls_names)) if not args.quick else ():
                stream(base, names[a], 2)
                stream(base, names[b], 2)
            mine: list[float] = []
            theirs: list[float] = []
            ratios: list[float] = []
            for i in range(1 if args.quick else pairs * 2):
                src, dst = (a, b) if i % 2 == 0 else (b, a)
                order = ("l", "s") if (i // 2) % 2 == 0 else ("s", "l")
                got = {}
                for who in order:
                    if who == "l":
                        got[who] = switch_time(lbase, src, dst)
                    else:
                        got[who] = switch_time(sbase, ls_names[src], ls_names[dst])
                mine.append(got["l"])
                theirs.append(got["s"])
                ratios.append(got["l"] / got["s"])
            print(f"bench_router: {', '.join(f'{n} ({p.name})' for n, p in files.items())}; --ctx {args.ctx} --parallel 1 --threads {t} "
                  f"--models-max 1; {len(ratios)} switches each, alternating directions and order")
            print(f"switch (last token of A -> first token of B), median: localllm {statistics.median(mine) * 1000:.0f} ms, "
                  f"llama-server {statistics.median(theirs) * 1000:.0f} ms")
            for k, (src, dst) in enumerate(((a, b), (b, a))[:len(mine)]):
                print(f"  {src} -> {dst}: localllm {statistics.median(mine[k::2]) * 1000:.0f} ms, "
                      f"llama-server {statistics.median(theirs[k::2]) * 1000:.0f} ms")
            print(ratio_line("switch localllm/llama-server", ratios, 1.1, True, judged))

            # steady decode: router vs single-model serve, alternating who goes first; the model the
            # router holds after the switches first (a after the full run's even count: the same order;
            # --quick's one switch leaves b: one load fewer). --quick: no warm-up (the rate starts at the
            # first token, so a load before it is not in it)
            for name in sorted(MODELS, key=lambda m: m != dst):
                if not args.quick:
                    stream(lbase, name, 2)  # loaded in the router (models-max 1 unloads the other)
                    stream(singles[name][1], name, 2)
                via, direct, dec = [], [], []
                for i in range(pairs):
                    order = ("r", "s") if i % 2 == 0 else ("s", "r")
                    got = {}
                    for who in order:
                        got[who] = decode_rate(lbase if who == "r" else singles[name][1], name, tokens)
                    via.append(got["r"])
                    direct.append(got["s"])
                    dec.append(got["r"] / got["s"])
                print(f"decode {name}, {tokens} tokens, median t/s: router {statistics.median(via):.1f}, serve {statistics.median(direct):.1f}")
                print(ratio_line(f"decode router/serve {name}", dec, 0.97, False, judged))
        finally:
            for proc in reversed(procs):
                stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
