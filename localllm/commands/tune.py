"""``localllm tune MODEL``: the settings llama.cpp leaves to the user, measured
on this machine and model, and the fastest the memory plan allows kept in the
model's ``[models."NAME"]`` table of the config file (issue 50 item 3).

What it uses, not duplicates: ``measure.bench.run_bench`` times prefill and
decode as ``localllm bench`` does; ``measure.quality.kv_cache_quality`` scores a
quantized KV cache as ``quantize --eval`` and ``doctor`` do; the planner gives
each candidate's memory as ``localllm plan`` does; ``measure.starved.contention``
says whether the machine is quiet enough to measure; ``threads.topology`` where
the thread count starts. The search, the choice and the file are ``localllm.tune``'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import flags
from localllm.errors import EXIT_ERROR, EXIT_INTERRUPTED, LocalLLMError, UsageError
from localllm.tune.candidates import FLASH_ATTN, KV_TYPE, ORDER, THREADS, UBATCH, Setting, values
from localllm.tune.choose import MAX_KL, REPLY_TOKENS, Run
from localllm.util import fmt
from localllm.util.units import Size

if TYPE_CHECKING:
    from localllm import runtime
    from localllm.flags import Subparsers
    from localllm.measure.starved import Contention
    from localllm.plan.prepare import LoadPlan
    from localllm.threads import topology
    from localllm.tune.runner import Tuner


def register(sub: Subparsers) -> None:
    p = sub.add_parser("tune", help="measure ubatch, flash attention, KV cache type and threads on this machine; keep the fastest in the config file",
        description="Each setting is measured on prefill and decode, alternated with the others, at the context you run; the "
        "fastest the memory plan allows goes into the model's [models.\"NAME\"] table of the config file, where run, chat, "
        "serve and the cockpit read it (a flag typed still wins; localllm plan shows what came from tune). Ctrl+C keeps "
        "what was measured.")
    flags.add_model(p)
    p.add_argument("--ctx", "-c", "--ctx-size", type=flags.int_at_least(1, "--ctx", flags.MAX_CTX), default=None, metavar="N",
                   help="the context to tune at (default: the one run uses: the model's, at most 4096)")
    p.add_argument("--threads", "-t", type=flags.threads, default=None, metavar="N", help="fix the thread count: it is then not tuned")
    p.add_argument("--vram", type=flags.size, default=None, metavar="SIZE", help="GPU memory budget for the plan (default: detected)")
    p.add_argument("--quick", action="store_true", help="a short run: few tokens, two candidates a setting (the test suite's)")
    p.add_argument("--force", action="store_true", help="measure even when another program keeps the CPU busy (the figures will be off)")
    p.add_argument("--max-kl", type=flags.float_in(0.0, None, "--max-kl", above=True), default=MAX_KL, metavar="X",
                   help="the most mean KL divergence against an f16 cache a quantized KV cache may cost to be chosen (default: %(default)s)")
    p.add_argument("--no-write", action="store_true", help="measure and show; leave the config file as it is")
    p.add_argument("--json", action="store_true", help="one JSON object: every figure, null where not measured")
    p.set_defaults(subparsers=None, typed_argv=None)  # cli.main and cli._parse set them: what was typed is not tuned


@dataclass(frozen=True)
class Options:
    model: str | None
    ctx: int | None
    threads: int | None
    vram: Size | None
    quick: bool
    force: bool
    max_kl: float
    no_write: bool
    json: bool
    subparsers: dict[str, argparse.ArgumentParser]  # each command's parser (cli.main)
    typed_argv: tuple[str, ...]  # what was typed after tune (cli._parse), to tell typed flags from the config file's

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, ctx=ns.ctx, threads=ns.threads, vram=ns.vram, quick=ns.quick, force=ns.force, max_kl=ns.max_kl,
                   no_write=ns.no_write, json=ns.json, subparsers=dict(ns.subparsers or {}), typed_argv=tuple(ns.typed_argv or ()))


def contention() -> Contention:
    """``measure.starved.contention``: what else keeps this machine's CPUs busy, imported when tune measures."""
    from localllm.measure.starved import contention as now  # lazy: psutil (~40 ms with the module), which --help does not need

    return now()


def kv_cache_quality(path: Path, types: Sequence[str], **kw: Any) -> list:
    """``measure.quality.kv_cache_quality``, imported when tune scores a KV type."""
    from localllm.measure.quality import kv_cache_quality as score  # lazy: numpy (~0.1 s), which --help (register above) does not need

    return score(path, types, **kw)


class Busy(LocalLLMError):
    """The machine is too busy for figures that mean anything."""


# (tokens generated after each prompt, rounds, KV quality tokens) per mode: the prompts are
# ``prompt_lengths``'s. Quick is the suite's: fewer tokens, one prompt, the shortest quality check.
KV_CHUNK = 256  # measure.quality.KV_CHUNK, the tokens of a KL chunk (that module loads numpy, which tune's --help does not)
FULL = {"gen": 32, "rounds": 2, "kl_tokens": 2 * KV_CHUNK}
QUICK = {"gen": 8, "rounds": 2, "kl_tokens": KV_CHUNK}
MIN_CTX = 64


def prompt_lengths(n_ctx: int, gen: int, quick: bool) -> list[int]:
    """Prompts that fit ``n_ctx`` with their reply: 128 and 512 tokens (quick: 128). 512 is
    the default ubatch, so the long prompt shows what a smaller one costs; 1024 doubled
    the time of a run (3 min 30 s for SmolLM2 on 2 cores) and chose the same."""
    room = n_ctx - gen - 16
    wanted = [128] if quick else [128, 512]
    return sorted({max(16, min(p, room)) for p in wanted})


def say(msg: str) -> None:
    print(f"tune: {fmt.safe(msg)}", file=sys.stderr, flush=True)


class Progress:
    """One line on stderr a run, with the time left: redrawn in place on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.open = False
        self.measured = False  # the measuring ended (finished or interrupted): what follows writes and shows it

    def __call__(self, line: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            print(f"\r\x1b[Ktune: {fmt.safe(line)}", end="", file=sys.stderr, flush=True)
            self.open = True
        else:
            say(line)

    def end(self) -> None:
        if self.open:
            print(file=sys.stderr, flush=True)
            self.open = False


def _user_value(key: str, value: Any, where: str, path: Path) -> Any:
    """A setting the user fixed in the file, in tune's type (the file already passed the flags' checks)."""
    try:
        return int(value) if key in (UBATCH, THREADS, "batch") else str(value)
    except (TypeError, ValueError):
        raise UsageError(f"{path}: {where} = {value!r}: give a whole number") from None


class Measurer:
    """The engine side: one model loaded at a time, reloaded when a candidate needs
    other load settings, every run pinned to the candidate's thread count."""

    def __init__(self, path: Path, plans: dict[tuple[int, str, str], runtime.Planned], prompts: list[int], gen: int) -> None:
        from localllm import runtime  # lazy: the load path loads gguf (~0.1 s), which --help does not need
        from localllm.modelfile.model_info import inspect_model  # lazy: as above

        self.path = path
        self.plans = plans
        self.prompts = prompts
        self.gen = gen
        self.backend = runtime.new_engine(serving=False)  # llama.cpp's, loaded and reloaded through the load path
        self.loaded: tuple[int, str, str] | None = None
        self.n_vocab = inspect_model(path).n_vocab

    def __call__(self, s: Setting, rnd: int) -> Run:
        from localllm import runtime  # lazy: as in __init__
        from localllm.measure.bench import run_bench  # lazy: the bench loop (~3 ms), which --help does not need

        key = s.load_key()
        if key != self.loaded:
            runtime.load(self.plans[key], self.backend)  # threads not fixed in the plan: each run pins its own count below
            self.loaded = key
        header = self.backend.header
        bos = header.get("tokenizer.ggml.bos_token_id") if header else None
        with self.backend.pinned_threads(s.threads):
            rows = run_bench(self.backend, prompt_lengths=self.prompts, gen_tokens=self.gen, reps=1, n_vocab=self.n_vocab, bos=bos)
        return Run({r.prompt_tokens: r.pp_tokens_per_s for r in rows}, {r.prompt_tokens: r.tg_tokens_per_s for r in rows})

    def free(self) -> None:
        """Unload before the quality check loads its three caches (and at the end)."""
        self.backend.close()
        self.loaded = None


def run(args: argparse.Namespace) -> int:
    from localllm.commands import config_file  # lazy: the config file's reader (tomllib, tempfile: ~11 ms), which --help does not need
    from localllm.store import resolver  # lazy: the store loads gguf (~0.1 s), which --help does not need
    from localllm.store.builtin import DEFAULT_MODEL  # lazy: as config_file
    from localllm.tune import section  # lazy: as config_file

    opts = Options.from_args(args)
    t0 = time.monotonic()
    model = opts.model or DEFAULT_MODEL
    cfg_path = config_file.config_file()
    table = config_file.load(cfg_path)
    if not opts.no_write:
        section.check_writable(cfg_path, model)  # a file tune cannot write: said now, not after minutes of measuring
    path = resolver.resolve(opts.model)
    progress = Progress(enabled=not opts.json)
    try:
        return _tune(opts, model, path, cfg_path, table, progress, t0)
    except KeyboardInterrupt:  # before the measuring started, or (a second Ctrl+C) while the result was written and shown
        progress.end()
        print("localllm: interrupted while the result was written: the config file holds the old section or the new one, "
              "never half" if progress.measured else
              "localllm: interrupted before anything was measured: the config file is untouched", file=sys.stderr)
        return EXIT_INTERRUPTED


def _fixed(opts: Options, table: dict[str, Any], model: str, cfg_path: Path) -> dict[str, tuple[Any, str]]:
    """The settings not to tune, with why: a typed --threads, and what the user wrote in the file."""
    from localllm.tune import section  # lazy: as in run

    out = {k: (_user_value(k, v, where, cfg_path), f"{where} in the config file") for k, (v, where) in section.user_settings(table, model).items()}
    typed = opts.subparsers["tune"].parse_args(list(opts.typed_argv)).threads if opts.subparsers else opts.threads
    if typed is not None:
        out[THREADS] = (typed, f"--threads {typed}")
    return out


def _tune(opts: Options, model: str, path: Path, cfg_path: Path, table: dict[str, Any], progress: Progress, t0: float) -> int:
    from localllm import runtime  # lazy: as in run
    from localllm.plan import fitting  # lazy: as above
    from localllm.threads import topology  # lazy: the CPU's topology (subprocess, platform: ~12 ms), which --help does not need
    from localllm.tune import section  # lazy: as in run
    from localllm.tune.runner import BecameBusy, Plan, Quality, Tuner  # lazy: the measuring loop (~2 ms), which --help does not need

    fixed = _fixed(opts, table, model, cfg_path)
    load = contention()  # before the model loads: what else runs, not this process
    if load.busy and not opts.force:
        raise Busy(f"the machine is too busy to measure: {load.cause()}; close it or wait, or add --force to measure anyway")
    if load.busy:
        say(f"warning: measuring on a busy machine (--force): {load.cause()}; the figures will be lower and noisier than on a quiet one")
    start = topology.start_threads()
    if start.note:
        say(start.note)  # the topology was hidden (a container, a locked-down /sys), or a hybrid CPU's E-cores left out
    batch = fixed.get("batch", (512, ""))[0]
    ubatch0 = fixed.get(UBATCH, (512, ""))[0]
    kv0 = fixed.get(KV_TYPE, (None, ""))[0]
    fa0 = fixed.get(FLASH_ATTN, ("auto", ""))[0]
    # no --ctx: the context run uses (the plan's default, fitting.default_ctx)
    base_opts = fitting.LoadOptions(n_ctx=opts.ctx, type_k=kv0, type_v=kv0, flash_attn=fa0, n_batch=batch, n_ubatch=ubatch0)
    base_plan = runtime.plan(runtime.LoadRequest(model=path, options=base_opts, vram=opts.vram)).lp
    if not base_plan.fit.fits:
        raise runtime.DoesNotFit(f"does not fit: {base_plan.fit.sentence} (localllm plan {model} shows where the memory goes)", base_plan.fit)
    cfg = base_plan.config
    n_ctx = cfg.n_ctx
    if n_ctx < MIN_CTX:
        raise UsageError(f"a context of {n_ctx} tokens is too small to measure: give --ctx {MIN_CTX} or more")
    if opts.ctx and n_ctx < opts.ctx:
        say(f"tuning at context {n_ctx}: {base_plan.fit.sentence}")
    threads0 = fixed.get(THREADS, (start.threads, ""))[0]
    base = Setting(ubatch=cfg.n_ubatch, flash_attn=fa0 if FLASH_ATTN in fixed else ("on" if cfg.uses_flash_attn else "off"),
                   kv_type=cfg.type_k, threads=threads0)
    mode = QUICK if opts.quick else FULL
    prompts = prompt_lengths(n_ctx, mode["gen"], opts.quick)
    plans: dict[tuple[int, str, str], runtime.Planned] = {}

    def plan(s: Setting) -> Plan:
        from localllm import runtime  # lazy: as in __init__

        key = s.load_key()
        if key not in plans:
            load_opts = fitting.LoadOptions(n_ctx=n_ctx, type_k=s.kv_type, type_v=s.kv_type, flash_attn=s.flash_attn, n_batch=batch, n_ubatch=s.ubatch)
            plans[key] = runtime.plan(runtime.LoadRequest(model=path, options=load_opts, vram=opts.vram))
        lp = plans[key].lp
        c = lp.config
        as_asked = lp.fit.fits and c.n_ctx == n_ctx and c.type_k == s.kv_type and c.n_ubatch == s.ubatch
        return Plan(as_asked, lp.total, None if as_asked else lp.fit.sentence)

    stages = _stages(fixed, opts.quick, min(n_ctx, batch), start.threads)
    measurer = Measurer(path, plans, prompts, mode["gen"])

    def quality(types: list[str]) -> dict[str, Quality]:
        measurer.free()
        rows = kv_cache_quality(path, types, max_tokens=mode["kl_tokens"], threads=base.threads)
        return {r.name: Quality(r.kl_mean, r.kl_p99, r.top1_agreement) for r in rows}

    def busy() -> str | None:
        """What took the CPU while a stage ran (the window is right after it); with --force, a warning."""
        now = contention()
        if not now.taken:
            return None
        if opts.force:
            say(f"warning: the machine is busy (--force): {now.cause()}")
            return None
        return now.cause()

    tuner = Tuner(base, stages, rounds=mode["rounds"], measure=measurer, plan=plan, quality=quality, progress=progress, max_kl=opts.max_kl,
                  busy=busy)
    interrupted = False
    became_busy: BecameBusy | None = None
    try:
        best = tuner.run()
    except KeyboardInterrupt:
        interrupted = True
        best = tuner.interrupted()
    except BecameBusy as exc:
        became_busy = exc
        best = tuner.interrupted()
    finally:
        progress.end()
        progress.measured = True
        measurer.free()
    chosen = _to_write(tuner, base, best)
    written: str | None = None
    date = time.strftime("%Y-%m-%d %H:%M")
    partial = interrupted or became_busy is not None
    if chosen and not opts.no_write:
        written = section.write(cfg_path, model, chosen, date, partial=partial)
    report = _report(opts, path, n_ctx, prompts, mode, load, start, tuner, base_plan, chosen, written, cfg_path, interrupted,
                     time.monotonic() - t0)
    if opts.json:
        fmt.print_json(report)
    else:
        print(render(report))
    kept = ", ".join(st.key for st in tuner.decided()) or "nothing"
    where = f"written to {cfg_path}" if written else "the config file is untouched"
    if became_busy is not None:
        print(f"localllm: error: the machine became too busy to measure during the {became_busy.key} stage ({became_busy.why}): "
              f"kept what was measured before it ({kept} decided; {where}); run tune again when it is quiet, or add --force",
              file=sys.stderr)
        return EXIT_ERROR
    if interrupted:
        print(f"localllm: interrupted: kept what was measured ({kept} decided; {where})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _stages(fixed: dict[str, tuple[Any, str]], quick: bool, ubatch_cap: int, start: int) -> list[tuple[str, list[Any] | str]]:
    out: list[tuple[str, list[Any] | str]] = []
    for key in ORDER:
        if key in fixed:
            out.append((key, f"not tuned: {fixed[key][1]} sets it to {fixed[key][0]}"))
            continue
        if key == KV_TYPE and fixed.get(FLASH_ATTN, ("", ""))[0] == "off":
            out.append((key, "not tuned: a quantized V cache needs flash attention, which the config file turns off"))
            continue
        vals = values(key, quick=quick, ubatch_cap=ubatch_cap, start_threads=start)
        if len(vals) < 2:
            out.append((key, "not tuned: one core" if key == THREADS else "not tuned: one value fits the context"))
            continue
        out.append((key, vals))
    return out


def _to_write(tuner: Tuner, base: Setting, best: Setting) -> dict[str, Any]:
    """The decided stages' choices. Threads only where a count other than the start
    won: without a ``threads`` key the count stays adaptive, which follows a load
    that comes later; a fixed one would not."""
    decided = {st.key for st in tuner.decided()}
    out = {k: best.value(k) for k in (FLASH_ATTN, KV_TYPE, UBATCH) if k in decided}
    if THREADS in decided and best.threads != base.threads:
        out[THREADS] = best.threads
    return out


def _report(opts: Options, path: Path, n_ctx: int, prompts: list[int], mode: dict[str, int], load: Contention,
            start: topology.Start, tuner: Tuner, base_plan: LoadPlan, chosen: dict[str, Any], written: str | None,
            cfg_path: Path, interrupted: bool, elapsed: float) -> dict[str, Any]:
    """``--json``: every figure the table shows, a figure not measured as null."""
    gpu = base_plan.fit.gpu_budget is not None
    busy = next(({"stage": st.key, "why": st.busy} for st in tuner.stages if st.busy), None)
    partial = interrupted or busy is not None  # the section holds the stages decided before the stop
    return {
        "model": path.name, "path": str(path), "n_ctx": n_ctx, "quick": bool(opts.quick), "rounds": mode["rounds"],
        "prompt_tokens": prompts, "gen_tokens": mode["gen"], "reply_tokens": REPLY_TOKENS, "max_kl": opts.max_kl,
        "contention": {**asdict(load), "busy": load.busy, "line": load.words()}, "forced": bool(opts.force and load.busy),
        "threads_start": {"threads": start.threads, "why": start.why, "note": start.note},
        "offload": ("GPU present: offload left to the plan's choice (not tuned: no GPU to test it on here)" if gpu
                    else "no GPU: offload not tuned"),
        "stages": [st.to_dict(tuner.max_kl) for st in tuner.stages],
        "chosen": chosen,
        "written": None if written is None else {"path": str(cfg_path), "table": f'models."{written}"', "settings": chosen,
                                                  "partial": partial},
        "no_write": bool(opts.no_write), "interrupted": interrupted, "partial": partial, "elapsed_s": round(elapsed, 1),
        "runs": tuner.done, "runs_s": round(tuner.runs_s, 1), "quality_s": None if tuner.quality_s is None else round(tuner.quality_s, 1),
        "became_busy": busy,
    }


def _rates(d: dict[str, float | None] | None, digits: int) -> str:
    if not d:
        return "n/a"
    return " / ".join(fmt.num(v, digits) if v is not None else "n/a" for v in d.values())


def _quality(c: dict[str, Any], key: str) -> str:
    if key != KV_TYPE:
        return ""
    if c["settings"]["kv_type"] == "f16":
        return "reference"
    return "n/a" if c["kl_mean"] is None else f"KL {c['kl_mean']:.4f}, top-1 {100 * c['top1_agreement']:.0f}%"


def render(r: dict[str, Any]) -> str:
    """The table: setting, prefill and decode t/s at each prompt, planned memory, quality, the choice."""
    lengths = " / ".join(map(str, r["prompt_tokens"]))
    lines = [f"tune · {fmt.safe(r['model'])} · context {r['n_ctx']:,} · threads start at {r['threads_start']['why']} · "
             f"{r['rounds']} rounds alternated · {'quick · ' if r['quick'] else ''}{r['gen_tokens']} tokens generated a prompt", ""]
    rows = []
    for st in r["stages"]:
        for c in st["candidates"]:
            mark = "chosen" if c["chosen"] else ("" if c["not_chosen_because"] in (None, "not measured") else c["not_chosen_because"])
            mem = "n/a" if c["memory_bytes"] is None else fmt.size(c["memory_bytes"]["total"])
            rows.append((f"{st['setting']} {c['value']}", _rates(c["prefill_tokens_per_s"], 0), _rates(c["decode_tokens_per_s"], 1),
                         mem, _quality(c, st["setting"]), mark))
    if rows:
        lines.append(fmt.table(("setting", f"prefill t/s ({lengths})", f"decode t/s ({lengths})", "memory", "quality vs f16", ""),
                               rows, right=(1, 2, 3)))
    lines += [f"{st['setting']}: {st['skipped']}" for st in r["stages"] if st["skipped"]]
    lines.append(r["offload"])
    lines.append("")
    chosen = ", ".join(f"{k} {v}" for k, v in r["chosen"].items()) or "nothing new (the defaults were fastest, or nothing was decided)"
    if THREADS not in r["chosen"] and any(st["setting"] == THREADS and st["chosen"] is not None and not st["skipped"] for st in r["stages"]):
        chosen += f"; threads stay adaptive (starting at {r['threads_start']['threads']} was fastest)"
    lines.append(f"chosen (a typical request: each prompt and a {r['reply_tokens']}-token reply; over 3% faster to win): {chosen}")
    if r["written"]:
        lines.append(f"written to {fmt.safe(r['written']['path'])} [{fmt.safe(r['written']['table'])}]"
                     + (" (partly measured: stopped early)" if r["partial"] else "")
                     + "; localllm plan shows them, a flag typed still wins")
    elif r["no_write"]:
        lines.append("not written (--no-write)")
    else:
        lines.append("the config file is untouched: nothing to write")
    spent = f"{r['runs']} runs {r['runs_s']:.0f} s" + ("" if r["quality_s"] is None else f", quality {r['quality_s']:.0f} s")
    lines.append(f"took {r['elapsed_s']:.0f} s ({spent})")
    return "\n".join(lines)

