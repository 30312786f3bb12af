"""``localllm plan``: where the memory goes, per device, and what fits the budget."""

from __future__ import annotations

import argparse

from localllm.commands._common import Fitted, fit_config
from localllm.engine_api import DryRun
from localllm.errors import EXIT_ERROR, EngineError
from localllm.modelfile.model_info import inspect_model
from localllm.plan import referee
from localllm.store import resolver
from localllm.util import fmt

RULES, REPLAY, DRY_RUN, ESTIMATE = "llama.cpp's rules", "graph replay", "llama.cpp's dry run", "estimate"


class Shown:
    """The compute and output figures ``plan`` shows, per column (GPU, CPU), and
    where each came from: the replay of llama.cpp's graph where it covers the
    model, else llama.cpp's dry run, else an estimate. Output buffers follow
    llama.cpp's rules, or its dry run where the replay does not cover the model."""

    def __init__(self, f: Fitted, dry: DryRun | None) -> None:
        p = f.fit.plan
        self.dry = dry
        self.compute = (p.compute_bytes if p.compute_on_gpu else 0, 0 if p.compute_on_gpu else p.compute_bytes)
        self.output = (0, p.output_bytes)
        self.compute_source = ESTIMATE if p.compute_estimated else REPLAY
        self.output_source = RULES
        if p.compute_estimated and dry is not None and dry.ok and dry.total("compute") is not None:
            self.compute = (dry.total("compute", cpu=False) or 0, dry.total("compute", cpu=True) or 0)
            self.output = (dry.total("output", cpu=False) or 0, dry.total("output", cpu=True) or 0)
            self.compute_source = self.output_source = DRY_RUN
        # the planner's totals, with its compute and output swapped for the figures shown
        planned = ((p.compute_bytes if p.compute_on_gpu else 0), (0 if p.compute_on_gpu else p.compute_bytes) + p.output_bytes)
        self.total = tuple(t - planned[c] + self.compute[c] + self.output[c] for c, t in enumerate((p.total_gpu_bytes, p.total_cpu_bytes)))

    def check_line(self) -> str:
        """The dry run's word on the figures: where they come from it, where it
        agrees with the replay, or why there is none."""
        dry = self.dry
        if dry is None:
            return "llama.cpp's dry run: not run (--no-dry-run, or a load over --rpc)"
        if not dry.ok:
            return f"llama.cpp's dry run: n/a ({dry.failed})"
        took = f" in {1000 * dry.seconds:.0f} ms" if dry.seconds is not None else ""
        if self.compute_source == DRY_RUN:
            return f"compute and output from llama.cpp's dry run{took} (the graph replay does not cover this model)"
        got = dry.total("compute")
        if got is None:
            return f"llama.cpp's dry run{took} logged no compute buffer"
        planned = sum(self.compute)
        diff = abs(got - planned) / got if got else 0.0
        verdict = "agrees" if diff <= 0.01 else f"differs by {diff:.1%}"
        return f"llama.cpp's dry run{took}: compute {fmt.size(got)}, {verdict} with the {self.compute_source}"

    def to_dict(self) -> dict:
        return {
            "sources": {"weights": "the file's tensors", "kv_cache": RULES, "compute": self.compute_source, "output": self.output_source},
            "compute_gpu_bytes": self.compute[0], "compute_cpu_bytes": self.compute[1],
            "output_gpu_bytes": self.output[0], "output_cpu_bytes": self.output[1],
            "total_gpu_bytes": self.total[0], "total_cpu_bytes": self.total[1],
            "dry_run": self.dry.to_dict() if self.dry is not None else None,
        }


def render(f, architecture: str = "", shown: Shown | None = None) -> str:
    r = f.fit
    p = r.plan
    shown = shown or Shown(f, None)
    hw = f.hardware
    gpu = r.gpu_budget is not None
    lines = [
        f"context {p.n_ctx} tokens · KV cache {p.type_k}/{p.type_v} · {fmt.size(p.kv_bytes_per_token)} per token"
        + (f" · {'chunked' if p.swa_type == 'chunked' else 'sliding-window'} layers hold {p.kv_swa_cells} cells" if p.kv_swa_cells else "")
        + (f" · {p.n_gpu_layers} layers on the GPU" if gpu else "")
        + ("" if p.verified else " (unverified architecture)"),
        "",
        fmt.table(
            ("", "GPU", "CPU"),
            [
                ("weights", fmt.size(p.weights_gpu_bytes), fmt.size(p.weights_cpu_bytes)),
                ("KV cache", fmt.size(p.kv_gpu_bytes), fmt.size(p.kv_cache_bytes - p.kv_gpu_bytes)),
                *([("recurrent", fmt.size(p.rs_gpu_bytes), fmt.size(p.rs_bytes - p.rs_gpu_bytes))] if p.rs_bytes else []),
                (f"compute ({shown.compute_source})", fmt.size(shown.compute[0]), fmt.size(shown.compute[1])),
                (f"output ({shown.output_source})", fmt.size(shown.output[0]), fmt.size(shown.output[1])),
                ("total", fmt.size(shown.total[0]), fmt.size(shown.total[1])),
            ],
            right=(1, 2),
        ),
        "",
    ]
    if gpu:
        src = {"--vram": "--vram", "nvml": hw.gpu_name, "apple-unified": "unified memory share"}.get(hw.gpu_source, hw.gpu_source)
        headroom = r.gpu_budget - p.total_gpu_bytes
        lines.append(f"GPU budget {fmt.size(r.gpu_budget)} ({src}), head-room {fmt.size(headroom)} (keeping {fmt.size(r.margin)} free)")
    else:
        lines.append("no GPU: everything runs from RAM")
    lines.append(f"RAM available {fmt.size(r.ram or 0)}")
    lines.append(shown.check_line())
    lines.append(("fits: " + r.sentence) if r.fits else ("does not fit: " + r.sentence))
    if not p.verified:
        lines.append(
            f"(unverified architecture) localllm knows no llama.cpp cache rule for '{architecture}': planned as dense, "
            "every layer with its own full-context cache; check with localllm run -v"
        )
    if f.shift_extra_bytes is None:
        lines.append("context shift: in place (the cache can shift without re-reading)")
    else:
        lines.append(
            "context shift: this sliding-window cache re-reads the kept window; "
            f"--swa-full makes it shift in place for {fmt.size(f.shift_extra_bytes)} more KV cache"
        )
    lines.append("largest context that fits: " + ", ".join(f"{k} {v:,}" if v else f"{k} none" for k, v in r.max_ctx_by_kv_type.items()))
    return "\n".join(lines)


def render_devices(f) -> str:
    """One column per device (with --rpc): the workers' devices, a local GPU, the CPU."""
    r = f.fit
    p = r.plan
    pl = f.placement
    uses = pl.uses

    def row(label: str, get) -> tuple[str, ...]:
        return (label, *(get(u) for u in uses))

    lines = [
        f"context {p.n_ctx} tokens · KV cache {p.type_k}/{p.type_v} · {fmt.size(p.kv_bytes_per_token)} per token"
        + (f" · sliding-window layers hold {p.kv_swa_cells} cells" if p.kv_swa_cells else "")
        + f" · {p.n_gpu_layers} of {sum(len(u.layers) for u in uses) + 1} layers offloaded",
        "",
        fmt.table(
            ("", *(u.device.name for u in uses)),
            [  # device names come from the workers: measured in cells
                row("layers", lambda u: f"{len(u.layers)}" + ("+out" if u.output_layer else "")),
                row("weights", lambda u: fmt.size(u.weights_bytes)),
                row(" mapped", lambda u: fmt.size(u.mapped_bytes) if u.mapped_bytes is not None else ""),
                row("KV cache", lambda u: fmt.size(u.kv_bytes)),
                row("compute", lambda u: fmt.size(u.compute_bytes)),
                row("output", lambda u: fmt.size(u.output_bytes)),
                row("total", lambda u: fmt.size(u.total_bytes)),
                row("free", lambda u: fmt.size(u.device.free_bytes) if u.device.free_bytes is not None else "n/a"),
            ],
            right=tuple(range(1, len(uses) + 1)),
        ),
        "",
        "split: " + ", ".join(f"{u.device.name} {s / sum(pl.split):.0%}" for u, s in zip(uses, pl.split)) if pl.split else "no offload device",
        *pl.rules,
        "mapped: the file range llama.cpp maps for the CPU's weights (its 'CPU_Mapped model buffer size'); only the CPU's own tensors are read from it",
        ("fits: " + r.sentence) if r.fits else ("does not fit: " + r.sentence),
        "largest context that fits: " + ", ".join(f"{k} {v:,}" if v else f"{k} none" for k, v in r.max_ctx_by_kv_type.items()),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    path = resolver.resolve(args.model)
    f = fit_config(args, path, args.ctx)
    dry = None
    if f.fit.fits and f.placement is None and not args.no_dry_run:
        dry = referee.dry_run(path, f.fit.config)
        if dry.refused is not None:
            raise EngineError(f"llama.cpp refuses this config: {dry.refused}")
    shown = Shown(f, dry)

    info = inspect_model(path)
    if args.json:
        d = f.fit.plan.to_dict()
        d.update(
            outcome=f.fit.outcome.value,
            fits=f.fit.fits,
            reason=f.fit.sentence,
            budget_gpu_bytes=f.fit.gpu_budget,
            ram_available_bytes=f.fit.ram,
            margin_bytes=f.fit.margin,
            max_ctx_by_kv_type=f.fit.max_ctx_by_kv_type,
            shiftable_cache_extra_bytes=f.shift_extra_bytes,
            hardware=f.hardware.to_dict(),
            architecture=info.architecture,
            cache_rule_source=info.cache_rule_source if info.cache_rule_verified else None,
        )
        d.update(shown.to_dict())
        if f.placement is not None:
            d.update(devices=f.placement.to_list(), tensor_split=list(f.placement.split), placement_rules=f.placement.rules)
        fmt.print_json(d)
    elif f.placement is not None:
        print(render_devices(f))
    else:
        print(render(f, info.architecture, shown))
    return 0 if f.fit.fits else EXIT_ERROR
