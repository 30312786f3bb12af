"""One way in to a load: read the header once, fit the request to the budget,
and let llama.cpp referee the figures the replay does not cover.

``prepare_load`` is what ``plan``, ``run``, ``chat``, ``serve``, ``doctor`` and
the cockpit ask before they load. Where ``compute_graph.py`` replays llama.cpp's
graph the compute figure is exact, and the load's own log checks it afterwards
(``memcheck``), so no dry run is spent on it unless asked (``plan`` asks, as a
cross-check). Where the replay does not cover the model (hybrid and recurrent
models, experts kept in RAM, separate streams, architectures it does not
rebuild) the compute figure is an estimate, so llama.cpp's dry run
(``referee.dry_run``, in a child process) gives the exact compute and output
buffers. When the dry run finds more than the estimate, the fit is redone with
the estimate scaled up to llama.cpp's figure and the new choice dry-run again,
so "fits" is never built on a figure below llama.cpp's. A config llama.cpp
refuses is refused here, with its reason, before any load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localllm.engine_api import DryRun, LoadConfig
from localllm.errors import EngineError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.plan import fitting, placement, planner, referee
from localllm.plan.hardware import Hardware
from localllm.util import fmt

RULES, REPLAY, DRY_RUN, ESTIMATE = "llama.cpp's rules", "graph replay", "llama.cpp's dry run", "estimate"
DryRunner = Callable[[Path, LoadConfig], DryRun]
_REFITS = 3  # dry runs at most: the first choice, and two refits with a larger compute figure
_STEP = 0.006 * 1024 * 1024  # llama.cpp prints MiB to two decimals


@dataclass(frozen=True)
class LoadPlan:
    """The fit, and the compute and output figures to show and to budget, per
    column (GPU or offload devices, CPU), each with where it came from."""

    fit: fitting.Fit
    hardware: Hardware
    dry: DryRun | None  # llama.cpp's dry run of ``fit.config``; None when not run (``skipped`` says why)
    compute: tuple[int, int]
    output: tuple[int, int]
    compute_source: str
    output_source: str
    skipped: str = ""
    refits: int = 0  # fits redone because llama.cpp's compute was above the estimate

    @property
    def config(self) -> LoadConfig:
        return self.fit.config

    @property
    def placement(self) -> Any:  # placement.Placement, with --rpc: per device
        return self.fit.placement

    @property
    def shift_extra_bytes(self) -> int | None:
        return self.fit.shift_extra_bytes

    @property
    def total(self) -> tuple[int, int]:
        """The planner's totals with its compute and output swapped for the figures shown."""
        p = self.fit.plan
        planned = _planned(p)
        return (p.total_gpu_bytes - planned[0][0] - planned[1][0] + self.compute[0] + self.output[0],
                p.total_cpu_bytes - planned[0][1] - planned[1][1] + self.compute[1] + self.output[1])

    @property
    def plan(self) -> planner.MemoryPlan:
        """The memory plan the load is checked against (``memcheck``): the
        planner's, with llama.cpp's compute and output where it gave them."""
        p = self.fit.plan
        if self.compute_source != DRY_RUN:
            return p
        logged = self.dry.total("output") if self.dry is not None else None
        shown = sum(self.output)  # the table's and the fit's (the size it grows to, where llama.cpp starts smaller)
        # llama.cpp's own figure: no longer an estimate (plan --json says so from here)
        return replace(p, compute_bytes=max(self.compute), output_bytes=shown,
                       output_at_load_bytes=logged if logged is not None and logged != shown else None, compute_estimated=False)

    def check_line(self) -> str:
        """The dry run's word on the figures: where they come from it, where it
        agrees with the replay, or why there is none."""
        dry = self.dry
        if dry is None:
            return f"llama.cpp's dry run: not run ({self.skipped})"
        if not dry.ok:
            return f"llama.cpp's dry run: n/a ({dry.failed}); compute is the {self.compute_source}"
        took = f" in {1000 * dry.seconds:.0f} ms" if dry.seconds is not None else ""
        if self.compute_source == DRY_RUN and self.placement is not None:
            return f"compute per device from llama.cpp's dry run{took} (it errs high on later devices under pipeline parallelism)"
        if self.compute_source == DRY_RUN:
            again = f"; the fit was redone {self.refits}× with llama.cpp's larger figure" if self.refits else ""
            what = "compute and output" if self.output_source == DRY_RUN else "compute"
            return f"{what} from llama.cpp's dry run{took} (the graph replay does not cover this model){again}"
        got = dry.total("compute")
        if got is None:
            return f"llama.cpp's dry run{took} logged no compute buffer"
        planned = sum(self.compute)
        diff = abs(got - planned) / got if got else 0.0
        verdict = "agrees" if diff <= 0.01 or abs(got - planned) <= _STEP else f"differs by {diff:.1%}"
        return f"llama.cpp's dry run{took}: compute {got / 2**20:.2f} MiB, {verdict} with the {self.compute_source}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": {"weights": "the file's tensors", "kv_cache": RULES, "compute": self.compute_source, "output": self.output_source},
            "compute_gpu_bytes": self.compute[0], "compute_cpu_bytes": self.compute[1],
            "output_gpu_bytes": self.output[0], "output_cpu_bytes": self.output[1],
            "total_gpu_bytes": self.total[0], "total_cpu_bytes": self.total[1],
            "dry_run": self.dry.to_dict() if self.dry is not None else None,
            "dry_run_skipped": self.skipped or None,
            "refits": self.refits,
            "n_cpu_moe": self.config.n_cpu_moe,  # experts in RAM: of layers 0..N-1, -1 all (asked, or chosen by the fit)
        }


def _planned(p: planner.MemoryPlan) -> tuple[tuple[int, int], tuple[int, int]]:
    """The planner's (compute, output) per column: compute where the layers run, output on the CPU."""
    compute = (p.compute_bytes, 0) if p.compute_on_gpu else (0, p.compute_bytes)
    return compute, (0, p.output_bytes)


def _figures(fit: fitting.Fit, hw: Hardware, dry: DryRun | None, skipped: str, refits: int) -> LoadPlan:
    p = fit.plan
    if fit.placement is not None:
        uses = fit.placement.uses
        cpu = uses[-1]
        compute = (sum(u.compute_bytes for u in uses[:-1]), cpu.compute_bytes)
        source = DRY_RUN if all(u.compute_source == DRY_RUN for u in uses) else ESTIMATE
        return LoadPlan(fit, hw, dry, compute, (0, cpu.output_bytes), source, RULES, skipped, refits)
    compute, output = _planned(p)
    source = ESTIMATE if p.compute_estimated else REPLAY
    if p.compute_estimated and dry is not None and dry.ok and dry.total("compute") is not None:
        if dry.total("compute", cpu=False) is None:
            # a build with no GPU (or a --vram budget simulated on one): llama.cpp
            # logged the CPU's buffers only; the column is the planner's
            got = dry.total("compute") or 0
            compute = (got, 0) if p.compute_on_gpu else (0, got)
        else:
            compute = (dry.total("compute", cpu=False) or 0, dry.total("compute", cpu=True) or 0)
        logged = (dry.total("output", cpu=False) or 0, dry.total("output", cpu=True) or 0)
        if sum(logged) >= p.output_bytes:
            return LoadPlan(fit, hw, dry, compute, logged, DRY_RUN, DRY_RUN, skipped, refits)
        # llama.cpp creates the output buffer for one row of logits and grows it at
        # the first batch with more (llama-context.cpp output_reserve): budget that
        return LoadPlan(fit, hw, dry, compute, (logged[0], p.output_bytes), DRY_RUN, RULES + " (the size it grows to)", skipped, refits)
    return LoadPlan(fit, hw, dry, compute, output, source, RULES, skipped, refits)


def _fits_shown(lp: LoadPlan) -> bool:
    """The budget check of ``placement.fits`` (one GPU and the CPU), on the figures shown."""
    f = lp.fit
    gpu, cpu = lp.total
    if f.gpu_budget is not None and gpu and gpu > f.gpu_budget - f.margin:
        return False
    return f.ram is None or cpu <= f.ram


def prepare_load(path: Path, request: fitting.Request, hw: Hardware, *, n_ctx: int | None = None, n_seq: int = 1,
                 devices: list | None = None, cpu: Any = None, dry_run: DryRunner | None = referee.dry_run,
                 cross_check: bool = False, header: GGUFHeader | None = None, serving: bool = False) -> LoadPlan:
    """Fit ``request`` for the model at ``path`` to ``hw`` (or to ``devices`` and
    ``cpu``: RPC workers' devices, a local GPU), reading the header once, and
    referee the figures with llama.cpp's dry run where the replay does not cover
    the model (always with ``cross_check``; never with ``dry_run=None``).
    Raises ``EngineError`` for a config llama.cpp refuses. ``header``: the
    file's, when the caller has read it already. ``serving`` with no ``n_ctx``:
    a server's default context (``fitting.for_header``)."""
    header = header if header is not None else read_header(path)
    req = fitting.for_header(header, request, n_ctx=n_ctx, n_seq=n_seq, serving=serving)
    budget = fitting.Budget.of(hw)
    kw: dict[str, Any] = {"devices": devices, "cpu": cpu} if devices is not None else {}
    fit = fitting.fit_header(header, req, budget, **kw)
    if dry_run is None:
        return _figures(fit, hw, None, "--no-dry-run", 0)
    if not fit.fits:
        return _figures(fit, hw, None, "the request does not fit", 0)
    if fit.placement is not None:
        return _across(path, fit, hw, budget, dry_run)
    if not fit.plan.compute_estimated and not cross_check:
        return _figures(fit, hw, None, "the graph replay covers this model; the load's own log checks it", 0)
    scale, refits = 1.0, 0
    while True:
        dry = dry_run(path, fit.config)
        if dry.refused is not None:
            raise EngineError(f"llama.cpp refuses this config: {dry.refused}")
        lp = _figures(fit, hw, dry, "", refits)
        if lp.compute_source != DRY_RUN or _fits_shown(lp):
            return lp
        if refits + 1 >= _REFITS:
            return _over(lp)
        # llama.cpp needs more than the estimate, and the choice no longer fits:
        # fit again with the estimate scaled up to llama.cpp's figure (1% over)
        scale *= sum(lp.compute) / max(fit.plan.compute_bytes, 1)
        refits += 1
        again = fitting.fit_header(header, req, budget, compute_scale=scale * 1.01, **kw)
        if not again.fits:
            return _figures(again, hw, None, "the request does not fit with llama.cpp's compute figure", refits)
        if again.config == fit.config:
            return _over(lp)
        fit = again


def _across(path: Path, fit: fitting.Fit, hw: Hardware, budget: fitting.Budget, dry_run: DryRunner) -> LoadPlan:
    """Over several devices (``--rpc``): each device's compute buffer from
    llama.cpp's dry run of the chosen placement (the workers answer it as they
    will the load); a device it puts over its budget makes the fit fail, naming it."""
    assert fit.placement is not None, "a fit across devices has a placement"
    dry = dry_run(path, fit.config)
    if dry.refused is not None:
        raise EngineError(f"llama.cpp refuses this config: {dry.refused}")
    if not dry.ok:
        return _figures(fit, hw, dry, "", 0)
    pl = placement.refereed(fit.placement, dry, DRY_RUN)
    fit = replace(fit, placement=pl)
    if not placement.fits(pl, budget.ram):
        over = [u for u in pl.uses if not placement.fits(replace(pl, uses=[u]), budget.ram)]
        why = "with llama.cpp's compute buffers (its dry run) " + ", ".join(
            f"{u.device.name} needs {fmt.size(u.total_bytes)} of {fmt.size((u.device.free_bytes if u.device.kind != 'cpu' else budget.ram) or 0)}"
            for u in over) + ": try a smaller --ctx or --ubatch"
        fit = replace(fit, outcome=fitting.Outcome.DOES_NOT_FIT, sentence=why)
    return _figures(fit, hw, dry, "", 0)


def _over(lp: LoadPlan) -> LoadPlan:
    """``lp`` found not to fit once llama.cpp's own compute figure is counted."""
    gpu, cpu = lp.total
    f = lp.fit
    if f.gpu_budget is not None and gpu > f.gpu_budget - f.margin:
        where = f"GPU needs {fmt.size(gpu)}, more than the budget {fmt.size(f.gpu_budget)} less {fmt.size(f.margin)} head-room"
    else:
        where = f"RAM needs {fmt.size(cpu)}, more than the {fmt.size(f.ram or 0)} available"
    why = f"with llama.cpp's compute buffer ({fmt.size(sum(lp.compute))}, from its dry run) the {where}: try a smaller --ctx or --ubatch"
    return replace(lp, fit=replace(f, outcome=fitting.Outcome.DOES_NOT_FIT, sentence=why))
