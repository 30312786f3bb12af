"""``localllm plan``: where the memory goes, per device, and what fits the budget."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, speculation
from localllm.commands._common import load_options, load_request, lora_specs, plan_load
from localllm.commands.serve_flags import DEFAULT_PARALLEL
from localllm.errors import EXIT_ERROR
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.measure.predict import Prediction
    from localllm.plan import fitting
    from localllm.plan.prepare import LoadPlan as Fitted
    from localllm.store import names
    from localllm.tune import section
    from localllm.vision.memory import ProjectorMemory


def register(sub: Subparsers) -> None:
    p = sub.add_parser("plan", help="memory per device: weights, KV cache, compute; what fits a GPU budget")
    flags.add_model(p)
    flags.add_load_options(p, ctx_help=f"context size in tokens, as run loads it (default: {flags.RUN_CTX}; serve's is shown too)")
    flags.add_lora(p)
    flags.add_vision(p, image=False)
    p.add_argument("--json", action="store_true", help="one JSON object")


@dataclass(frozen=True)
class Options:
    model: str | None
    load: flags.Load
    lora: flags.Lora
    vision: flags.Vision
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns), vision=flags.Vision.from_args(ns), json=ns.json)


def fit_line(r) -> str:
    """"fits as asked", "fits: context 2048 instead of 4096", "does not fit: …" (never "fits: fits as asked")."""
    if not r.fits:
        return "does not fit: " + r.sentence
    return r.sentence if r.sentence.startswith("fits") else "fits: " + r.sentence


def render(f: Fitted, architecture: str = "", projector: ProjectorMemory | None = None, *, default_ctx: bool = False) -> str:
    # lazy: the planner's rules load gguf (~0.1 s), which --help (register above) does not need
    from localllm.modelfile.arch_rules import M_ROPE
    from localllm.plan.placement import experts_rule  # lazy: as in render
    from localllm.plan.planner import layers_phrase  # lazy: as in render

    r = f.fit
    p = r.plan
    shown = f
    hw = f.hardware
    gpu = r.gpu_budget is not None
    lines = [
        f"context {_context(r, default_ctx)} · KV cache {p.type_k}/{p.type_v} · {fmt.size(p.kv_bytes_per_token)} per token"
        + (f" · {'chunked' if p.swa_type == 'chunked' else 'sliding-window'} layers hold {p.kv_swa_cells} cells" if p.kv_swa_cells else "")
        + (f" · {layers_phrase(p.n_gpu_layers, r.n_layers)} on the GPU" if gpu else "")
        + ("" if p.verified else " (unverified architecture)"),
        "",
        fmt.table(
            ("", "GPU", "CPU"),
            [
                ("weights", fmt.size(p.weights_gpu_bytes), fmt.size(p.weights_cpu_bytes)),
                # LoRA adapters, counted in the weights: each tensor on its base tensor's device (planner.with_adapters)
                *([(" of which LoRA", fmt.size(p.lora_gpu_bytes), fmt.size(p.lora_cpu_bytes))] if p.lora_gpu_bytes + p.lora_cpu_bytes else []),
                ("KV cache", fmt.size(p.kv_gpu_bytes), fmt.size(p.kv_cache_bytes - p.kv_gpu_bytes)),
                *([("recurrent", fmt.size(p.rs_gpu_bytes), fmt.size(p.rs_bytes - p.rs_gpu_bytes))] if p.rs_bytes else []),
                (f"compute ({shown.compute_source})", fmt.size(shown.compute[0]), fmt.size(shown.compute[1])),
                (f"output ({shown.output_source})", fmt.size(shown.output[0]), fmt.size(shown.output[1])),
                *_projector_rows(projector),
                ("total", *(fmt.size(t) for t in _total(shown.total, projector))),
            ],
            right=(1, 2),
        ),
        "",
    ]
    if p.experts_ram_bytes:
        lines.append(experts_rule(p.experts_ram_layers, r.n_layers - 1, p.experts_ram_bytes))
    if r.gpu_budget is not None:
        src = {"--vram": "--vram", "nvml": hw.gpu_name, "apple-unified": "unified memory share"}.get(hw.gpu_source, hw.gpu_source)
        left = r.gpu_budget - r.margin - _total(shown.total, projector)[0]
        # one meaning for "head-room": the margin kept free (the planner's, as in its messages)
        lines.append(f"GPU budget {fmt.size(r.gpu_budget)} ({src}), {fmt.size(r.margin)} of it kept free as head-room, "
                     + (f"{fmt.size(left)} left over" if left >= 0 else f"{fmt.size(-left)} short"))
    else:
        lines.append("no GPU: everything runs from RAM")
    lines.append(f"RAM available {fmt.size(r.ram or 0)}")
    lines.append(shown.check_line())
    lines.append(fit_line(r))
    if not p.verified:
        lines.append(
            f"(unverified architecture) localllm knows no llama.cpp cache rule for '{architecture}': planned as dense, "
            "every layer with its own full-context cache; check with localllm run -v"
        )
    if architecture in M_ROPE:
        lines.append("context shift: re-reads the kept window (llama.cpp cannot shift an M-RoPE cache); one that holds images stops instead")
    elif f.shift_extra_bytes is None:
        lines.append("context shift: in place (the cache can shift without re-reading)")
    else:
        lines.append(
            "context shift: this sliding-window cache re-reads the kept window; "
            f"--swa-full makes it shift in place for {fmt.size(f.shift_extra_bytes)} more KV cache"
        )
    lines.append("largest context that fits: " + ", ".join(f"{k} {v:,}" if v else f"{k} none" for k, v in r.max_ctx_by_kv_type.items()))
    return "\n".join(lines)


def _context(fit: fitting.Fit, default_ctx: bool) -> str:
    """"4096 tokens (run's default, at most 4096; trained 32768)"."""
    from localllm.plan import fitting  # lazy: as in render

    c = fitting.context_choice(fit, default=default_ctx)
    return f"{c.n_ctx} tokens ({c.reason})"


def served(opts: Options, path: Path, f: Fitted) -> tuple[Fitted, fitting.ContextChoice] | None:
    """What ``serve MODEL`` with no ``--ctx`` loads here: each of its default
    ``--parallel`` sequences the trained context, or the largest that fits
    (``fitting.default_ctx``), fitted as serve fits it, with this plan's other
    load options and budget. The compute is the graph replay's where it covers
    the model, else an estimate, which the line says: no second dry run of
    llama.cpp (about 0.5 s a model) for one line; serve's own start dry-runs it.
    None with ``--rpc``: the workers would be probed a second time."""
    from localllm import api  # lazy: as in render
    from localllm.modelfile.lora import read_adapter  # lazy: as in render
    from localllm.plan import fitting  # lazy: as in render

    if opts.load.rpc:
        return None
    n = DEFAULT_PARALLEL
    request = replace(load_options(opts.load, fitting.DEFAULT_CTX).request(), adapters=tuple(read_adapter(s.path) for s in lora_specs(opts.lora)))
    request = replace(request, config=replace(request.config, n_outputs_max=n * (speculation.rows("auto", serving=True) or 1)))  # as serve loads
    lp = api.prepare(path, request, hw=f.hardware, n_seq=n, dry_run=False, serving=True)
    return lp, fitting.context_choice(lp.fit, n, default=True)


def served_line(s: tuple[Fitted, fitting.ContextChoice]) -> str:
    """"serve with no --ctx: 32768 tokens per request (trained) x 4 parallel, KV cache f16/f16 421.50 MiB (131072 cells), 808.93 MiB in all"."""
    from localllm.plan.prepare import ESTIMATE  # lazy: as in render

    lp, c = s
    head = f"serve with no --ctx: {c.n_ctx} tokens per request ({c.reason}) x {lp.config.n_seq} parallel"
    if not lp.fit.fits:
        return f"{head}: does not fit: {lp.fit.sentence}"
    gpu, cpu = lp.total
    where = f"GPU {fmt.size(gpu)}, RAM {fmt.size(cpu)}" if lp.fit.gpu_budget is not None else f"{fmt.size(gpu + cpu)} in all"
    return (f"{head}, KV cache {lp.config.type_k}/{lp.config.type_v} {fmt.size(lp.plan.kv_cache_bytes)} ({lp.config.n_ctx} cells), {where}"
            + (" (compute an estimate)" if lp.compute_source == ESTIMATE else ""))


def served_dict(s: tuple[Fitted, fitting.ContextChoice] | None) -> dict | None:
    """``plan --json``'s ``serve``: the figures ``served_line`` says."""
    from localllm.plan.prepare import ESTIMATE  # lazy: as in render

    if s is None:
        return None
    lp, c = s
    gpu, cpu = lp.total
    return {"parallel": lp.config.n_seq, "context": c.to_dict(), "n_ctx": lp.config.n_ctx, "type_k": lp.config.type_k,
            "type_v": lp.config.type_v, "kv_cache_bytes": lp.plan.kv_cache_bytes, "total_gpu_bytes": gpu, "total_cpu_bytes": cpu,
            "compute_estimated": lp.compute_source == ESTIMATE, "fits": lp.fit.fits, "reason": lp.fit.sentence}


def _on(mem: ProjectorMemory, n: int | None) -> tuple[str, str]:
    cell = fmt.size(n) if n is not None else "n/a"
    return (cell, "") if mem.device == "GPU" else ("", cell)


def _projector_rows(mem: ProjectorMemory | None) -> list[tuple[str, str, str]]:
    """The projector's weights and compute buffer, in the column of the device clip.cpp puts them on (vision.memory)."""
    if mem is None:
        return []
    return [("projector weights", *_on(mem, mem.weights_bytes)), ("projector compute (estimate)", *_on(mem, mem.compute_bytes))]


def _total(total: tuple[int, int], mem: ProjectorMemory | None) -> tuple[int, int]:
    from localllm.vision import choice  # lazy: as in render

    if mem is None:
        return total
    need = choice.need(mem)
    return (total[0] + need, total[1]) if mem.device == "GPU" else (total[0], total[1] + need)


def projector_line(path: Path, mem: ProjectorMemory, free: int | None) -> str:
    """Whether the projector fits beside the model: what it needs, and what is left or short."""
    from localllm.vision import choice  # lazy: as in render

    need = choice.need(mem)
    head = f"projector {path.name}: {fmt.size(need)} on the {mem.device} (compute an estimate)"
    if free is None:
        return head + "; RAM available is not known"
    return head + (f", fits with {fmt.size(free - need)} to spare" if free >= need else
                   f", does not fit: {fmt.size(need - free)} short (try --no-mmproj, a smaller --ctx or a smaller quant)")


def render_devices(f: Fitted, *, default_ctx: bool = False) -> str:
    """One column per device (with --rpc): the workers' devices, a local GPU, the CPU."""
    from localllm.plan.planner import layers_phrase  # lazy: as in render

    r = f.fit
    p = r.plan
    pl = f.placement
    uses = pl.uses

    def row(label: str, get) -> tuple[str, ...]:
        return (label, *(get(u) for u in uses))

    lines = [
        f"context {_context(r, default_ctx)} · KV cache {p.type_k}/{p.type_v} · {fmt.size(p.kv_bytes_per_token)} per token"
        + (f" · sliding-window layers hold {p.kv_swa_cells} cells" if p.kv_swa_cells else "")
        + f" · {layers_phrase(p.n_gpu_layers, r.n_layers)} offloaded",
        "",
        fmt.table(
            ("", *(u.device.name for u in uses)),
            [  # device names come from the workers: measured in cells
                row("layers", lambda u: f"{len(u.layers)}" + ("+out" if u.output_layer else "")),
                row("weights", lambda u: fmt.size(u.weights_bytes)),
                row(" mapped", lambda u: fmt.size(u.mapped_bytes) if u.mapped_bytes is not None else ""),
                row("KV cache", lambda u: fmt.size(u.kv_bytes)),
                row(f"compute ({f.compute_source})", lambda u: fmt.size(u.compute_bytes)),
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
        f.check_line(),
        fit_line(r),
        "largest context that fits: " + ", ".join(f"{k} {v:,}" if v else f"{k} none" for k, v in r.max_ctx_by_kv_type.items()),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from localllm.store import names, resolver  # lazy: as in render

    opts = Options.from_args(args)
    try:
        path = resolver.resolve(opts.model)
    except names.NotDownloaded as nd:
        # a model not downloaded: planned from its header, read over HTTP ranges into a sparse stub
        with names.header_of(nd.name) as (stub, remote):
            return _plan(opts, stub, remote)
    return _plan(opts, path, None)


def _predicted(opts: Options, f: Fitted, path: Path) -> Prediction | None:
    """The decode ceiling of the chosen plan (``measure.predict``); None when it does not fit.
    GPU memory's bandwidth is NVML's or the Apple chip's, unknown for a --vram
    budget on a machine without one and for a worker's device."""
    from localllm.measure.predict import predict  # lazy: as in render
    from localllm.modelfile.gguf_file import read_header  # lazy: as in render
    from localllm.plan.hardware import gpu_memory_bandwidth, physical_cores  # lazy: as in render
    from localllm.plan.planner import ModelShape  # lazy: as in render

    if not f.fit.fits:
        return None
    hw = f.hardware
    gpu = f.fit.gpu_budget is not None
    known = f.placement is None and hw.gpu_source in ("nvml", "apple-unified")
    shape = ModelShape.from_header(read_header(path))
    return predict(shape, f.fit.plan, gpu=gpu, gpu_bandwidth=gpu_memory_bandwidth() if known else None,
                   threads=opts.load.threads or physical_cores())


def _audio_compute(proj: Path) -> int | None:
    """The projector's audio encoder's compute buffer, estimated from its header (None: none, or not known)."""
    from localllm.audio.projector import describe_audio  # lazy: as in render
    from localllm.modelfile.gguf_file import read_header  # lazy: as in render

    audio = describe_audio(read_header(proj))
    return audio.compute_estimate() if audio is not None else None


def _plan(opts: Options, path: Path, remote: names.Remote | None) -> int:
    from localllm.commands import vision_cli  # lazy: as in render
    from localllm.modelfile.model_info import inspect_model  # lazy: as in render
    from localllm.vision import choice  # lazy: as in render
    from localllm.vision.projector import read_projector  # lazy: as in render

    # a vision model's projector (given, or beside the model; a stub of a remote model has none)
    proj = vision_cli.projector_path(opts.vision, path, quiet=opts.json) if remote is None or opts.vision.mmproj else None
    f = fit_config(opts, path, opts.load.ctx)
    predicted = _predicted(opts, f, path)
    info = inspect_model(path)
    mem, free = choice.room(f.fit, proj, _audio_compute(proj)) if proj is not None else (None, None)
    serve = served(opts, path, f)
    if opts.json:
        d = as_dict(f, info, predicted, remote, default_ctx=opts.load.ctx is None)
        d["serve"] = served_dict(serve)
        d["projector"] = None if proj is None or mem is None else {
            **read_projector(proj).to_dict(), "memory": mem.to_dict(),
            "left_bytes": None if free is None else free - choice.need(mem),
            "fits": None if free is None else free >= choice.need(mem)}
        tuned = _from_tune(opts)
        d["from_tune"] = tuned.to_dict() if tuned is not None else None
        fmt.print_json(d)
    else:
        print(as_text(f, info, predicted, remote, mem, default_ctx=opts.load.ctx is None))
        if serve is not None:
            print(served_line(serve))
        tuned = _from_tune(opts)
        if tuned is not None:
            print(f"settings {tuned.line()}")
        if proj is not None and mem is not None:
            print(projector_line(proj, mem, free))
    fits_projector = mem is None or free is None or free >= choice.need(mem)
    return 0 if f.fit.fits and fits_projector else EXIT_ERROR


def _from_tune(opts: Options) -> section.FromTune | None:
    """The settings planned with that ``localllm tune`` chose (its record in the model's
    config table), less any a flag typed or an edit since changed."""
    from localllm.commands import config_file  # lazy: the config file's reader (tomllib, tempfile: ~11 ms), which --help does not need
    from localllm.store.builtin import DEFAULT_MODEL  # lazy: as config_file
    from localllm.tune import section  # lazy: as config_file

    return section.from_tune(config_file.load(), opts.model or DEFAULT_MODEL, section.flag_values(
        ubatch=opts.load.ubatch, flash_attn=opts.load.flash_attn, kv_type=opts.load.kv_type, threads=opts.load.threads))


def as_dict(f: Fitted, info, predicted: Prediction | None, remote: names.Remote | None, *, default_ctx: bool = False) -> dict:
    """``plan --json``: the figures ``as_text`` shows, from the same refereed plan (issue 45 item 7)."""
    from localllm.modelfile.arch_rules import M_ROPE  # lazy: as in render
    from localllm.plan import fitting  # lazy: as in render

    d = f.plan.to_dict()  # the refereed plan: llama.cpp's compute where its dry run gave it, as the table shows
    d.update(
        context=fitting.context_choice(f.fit, default=default_ctx).to_dict(),
        outcome=f.fit.outcome.value,
        fits=f.fit.fits,
        reason=f.fit.sentence,
        budget_gpu_bytes=f.fit.gpu_budget,
        ram_available_bytes=f.fit.ram,
        margin_bytes=f.fit.margin,
        max_ctx_by_kv_type=dict(f.fit.max_ctx_by_kv_type),
        shiftable_cache_extra_bytes=f.shift_extra_bytes,
        context_shift="reprocess" if info.architecture in M_ROPE else "in_place" if f.shift_extra_bytes is None else "reprocess_window",
        hardware=f.hardware.to_dict(),
        architecture=info.architecture,
        cache_rule_source=info.cache_rule_source if info.cache_rule_verified else None,
        remote={"repo": remote.name.repo_id, "filename": remote.file.filename, "size_bytes": remote.file.size,
                "downloaded": False} if remote is not None else None,
    )
    d.update(f.to_dict())
    d["predicted_decode"] = predicted.to_dict() if predicted is not None else None
    if f.placement is not None:
        d.update(devices=f.placement.to_list(), tensor_split=list(f.placement.split), placement_rules=f.placement.rules)
    return d


def as_text(f: Fitted, info, predicted: Prediction | None, remote: names.Remote | None, projector: ProjectorMemory | None = None,
            *, default_ctx: bool = False) -> str:
    """``plan``'s table and lines; ``default_ctx``: no --ctx was given (``fitting.context_choice``)."""
    out = []
    if remote is not None:
        out.append(f"{fmt.safe(remote.label)} ({fmt.size(remote.file.size)}): not downloaded; its header was read from the Hub, nothing stored "
                   f"(localllm pull {fmt.safe(remote.name.pull_arg)} gets it)\n")
    out.append(render_devices(f, default_ctx=default_ctx) if f.placement is not None
               else render(f, info.architecture, projector, default_ctx=default_ctx))
    if predicted is not None:
        out.append(predicted.line())
    return "\n".join(out)


def fit_config(opts: Options, path: Path, n_ctx: int | None) -> Fitted:
    """The options fitted to the GPU budget (detected or --vram) and RAM, as a
    load would fit them (``plan_load``): the settings that fit, the user's
    explicit choices kept, llama.cpp's dry run as the referee where the replay
    does not cover the model (unless --no-dry-run), and where it covers it too (a cross-check)."""
    # with the rows of logits run and chat load for speculation's drafts (speculation.rows): the plan is of their load
    return plan_load(opts.load, load_request(opts.load, opts.lora, path, n_ctx, cross_check=True, n_outputs=speculation.rows("auto"))).lp
