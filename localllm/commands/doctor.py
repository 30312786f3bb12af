"""``localllm doctor``: measure, name the bottleneck, rank what to change."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, speculation
from localllm.commands._common import load_request, plan_load
from localllm.errors import InputError, LocalLLMError, UsageError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("doctor", help="why is it slow? measure TTFT, ITL and the roofline, name the bottleneck, rank fixes")
    flags.add_model(p)
    p.add_argument("--prompt-file", default=None, metavar="F", help="a prompt like yours (default: a page of text and a question)")
    p.add_argument("--gen-tokens", type=flags.int_at_least(2, "--gen-tokens"), default=64, metavar="N", help="tokens to generate (default: 64)")
    p.add_argument("--no-quality", action="store_true", help="skip measuring what a q8_0 KV cache costs")
    flags.add_load_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object")


@dataclass(frozen=True)
class Options:
    model: str | None
    prompt_file: str | None
    gen_tokens: int
    no_quality: bool
    load: flags.Load
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, prompt_file=ns.prompt_file, gen_tokens=ns.gen_tokens, no_quality=ns.no_quality,
                   load=flags.Load.from_args(ns), json=ns.json)


def _prompt(opts: Options) -> str:
    if opts.prompt_file:
        p = Path(opts.prompt_file)
        if not p.is_file():
            raise InputError(f"prompt file not found: {p}")
        text = p.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            raise UsageError(f"{p} is empty")
        return text

    # A typical request: a page of context and a question about it.
    from localllm.measure.quality import eval_text  # lazy: numpy (~0.1 s), which --help (register above) does not need

    return eval_text()[:2000] + "\n\nSummarize the text above in three sentences."


def _kv_kl(path: Path, threads: int | None) -> dict[str, float]:
    """Mean KL of q8_0 and q4_0 caches against f16 on one 256-token chunk of the shipped text."""
    from localllm.measure.quality import kv_cache_quality  # lazy: as in _prompt

    return {r.name: r.kl_mean for r in kv_cache_quality(path, ("q8_0", "q4_0"), threads=threads)}


def _roofline_line(r) -> str:
    """Bandwidth per thread count, bytes per token split by device, the ceiling."""
    by_threads = ", ".join(f"{n} thread{'s' if n > 1 else ''} {bw:.1f}" for n, bw in sorted(r.bandwidth_by_threads_gb_per_s.items()))
    cpu_bytes = r.bytes_per_token - r.gpu_bytes_per_token
    reads = f"{fmt.size(cpu_bytes)} from RAM at {r.bandwidth_gb_per_s:.1f} GB/s"
    remote = any(d["kind"] == "rpc" for d in r.settings.get("devices", []))
    if r.gpu_bytes_per_token and remote:
        reads += f" + {fmt.size(r.gpu_bytes_per_token)} on the offload devices (the workers') at n/a (not measured from here)"
    elif r.gpu_bytes_per_token:
        gbw = "n/a (unknown GPU bandwidth)" if r.gpu_bandwidth_gb_per_s is None else f"{r.gpu_bandwidth_gb_per_s:.0f} GB/s"
        reads += f" + {fmt.size(r.gpu_bytes_per_token)} from GPU memory at {gbw}"
    ceiling = fmt.num(r.decode_ceiling_tokens_per_s, 0)
    eff = "n/a" if r.decode_efficiency is None else f"{100 * r.decode_efficiency:.0f}%"
    return (f"   roofline     memory bandwidth GB/s by threads: {by_threads}\n"
            f"                per token {reads} = {ceiling} t/s ceiling; decode at {eff} of it")


def _threads_line(r) -> str:
    """The machine's load before the measurement, and decode by thread count (issue 50 item 4)."""
    load = f"   contention   {r.contention['line']}" if r.contention else "   contention   n/a (not measured)"
    rates = r.decode_by_threads_tokens_per_s
    by = ", ".join(f"{n} {t:.1f}" for n, t in sorted(rates.items())) if rates else "n/a"
    tune = f"\n   tune         {fmt.safe(r.tune['line'])}" if r.tune else ""
    return f"{load}\n                decode t/s by threads, alternated: {by}{tune}"


def _tune_advice(model: str | None) -> dict:
    """Whether ``localllm tune`` measured this model here (its ``tuned`` record in the
    model's config table), and the command that would: doctor measures one setting,
    tune the rest (flash attention, KV type, ubatch, threads) against each other."""
    from localllm.commands import config_file  # lazy: as tune's own command reads it
    from localllm.store.builtin import DEFAULT_MODEL  # lazy: only this line of doctor's needs them
    from localllm.tune import section  # lazy: as above

    name = model or DEFAULT_MODEL
    try:
        found = section.model_entry(config_file.load(config_file.config_file()), name)
        record = section.record_of(found[1] if found else None)
    except (LocalLLMError, OSError):
        record = None
    command = f"localllm tune {name}"
    if record is not None:
        done = section.FromTune(record.date, dict(record.settings), record.partial)  # as plan shows it
        return {"tuned": done.to_dict(), "advice": None, "line": f"tuned here: {done.line()}; {command} measures again"}
    advice = (f"{command}: measures flash attention, the KV type (with its KL), ubatch and threads on this machine "
              "and keeps the fastest the memory plan allows (about 3 min; --quick under 1)")
    return {"tuned": None, "advice": command, "line": f"not tuned here: {advice}"}


def _layers_by_device(devices: list[dict]) -> str:
    """``layers: RPC0[10.0.0.2:50052] 30 + output, CPU 0`` (with --rpc)."""
    return "layers: " + ", ".join(f"{fmt.safe(d['name'])} {d['layers']}" + (" + output" if d["output_layer"] else "") for d in devices)


def render(r, name: str) -> str:
    s = r.settings
    lines = [
        f"doctor · {name} · {r.file_type} ({r.bits_per_weight:.2f} bits per weight)",
        "",
        f"1. input        {r.prompt_tokens} prompt tokens",
        f"2. TTFT         {fmt.ms(r.ttft_ms)} (prefill {fmt.num(r.prefill_tokens_per_s, 1)} t/s)",
        f"3. ITL          p50 {fmt.ms(r.itl_p50_ms)}, p95 {fmt.ms(r.itl_p95_ms)} (decode {fmt.num(r.decode_tokens_per_s, 1)} t/s)",
        _roofline_line(r),
        f"4. KV cache     {fmt.size(r.kv_cache_bytes)} at full context ({100 * r.kv_share_of_memory:.0f}% of the memory); "
        f"{r.concurrency_at_full_context} more full-context sequences would fit",
        f"5. quantization {r.file_type} weights, {s['type_k']}/{s['type_v']} KV cache; largest context that fits by cache type: "
        + ", ".join(f"{t} {v['max_ctx']:,}" + (f" (KL {v['kl_mean']:.4f})" if v.get("kl_mean") else "") for t, v in r.kv_types.items()),
        "                 (a smaller weight quant's quality cost needs its source file: localllm quantize SOURCE --type Q4_K_M --eval)",
        (f"   speculative  n-gram drafts measured x{r.speculative_gain:.2f} tokens/s ({100 * (r.speculative_acceptance or 0):.0f}% accepted): "
         + ("worth it" if r.speculative_gain >= 1.05 else "not worth it here") if r.speculative_gain is not None else "   speculative  not measured"),
        f"6. engine       flash attention {s['flash_attn']}, batch {s['n_batch']}/{s['n_ubatch']}, "
        + (_layers_by_device(s['devices']) if "devices" in s else
           f"{s['n_gpu_layers']} layers on the GPU{'' if s['gpu_offload_supported'] else ' (a CPU build)'}")
        + f", threads {s['threads']} of {s['physical_cores']} cores",
        _threads_line(r),
        "",
        f"bottleneck: {r.bottleneck} · {r.verdict}",
        "",
        "what to change, largest expected effect first:",
    ]
    for i, a in enumerate(r.actions, 1):
        lines.append(f"  {i}. {a.action}\n     {a.expected} [{a.basis}]\n     why: {a.why}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # lazy: the load path, the store and the measurements load gguf and numpy (~0.2 s), which --help does not need
    from localllm import runtime
    from localllm.measure.doctor import examine, measure, measure_speculation  # lazy: as above
    from localllm.measure.roofline import measure_by_threads  # lazy: as above
    from localllm.measure.starved import contention  # lazy: as above
    from localllm.measure.thread_counts import decode_by_threads, thread_action  # lazy: as above
    from localllm.plan.hardware import gpu_memory_bandwidth, physical_cores  # lazy: the GPU and CPU probes (psutil: ~3 ms), which --help does not need
    from localllm.store import resolver  # lazy: as above

    opts = Options.from_args(args)
    path = resolver.resolve(opts.model)
    prompt = _prompt(opts)
    # Rows of logits for the drafts, as run and chat load, so the same context checks speculation.
    planned = plan_load(opts.load, load_request(opts.load, flags.NO_LORA, path, opts.load.ctx, n_outputs=speculation.rows("auto"))).check()
    fitted = planned.lp
    say = (lambda m: None) if opts.json else (lambda m: print(f"doctor: {m}", file=sys.stderr, flush=True))
    say("measuring how busy the machine is")
    load = contention()  # before the model loads: what else runs, not this process
    placement = planned.placement
    with runtime.load(planned) as loaded:
        backend, info, memory_check = loaded.engine, loaded.info, loaded.memory_check
        say("measuring prefill and decode")
        stats = measure(backend, prompt, gen_tokens=opts.gen_tokens, chat=backend.has_chat_template)
        header = backend.header
        assert header is not None  # loaded just above
        spec = None
        if backend.context_used + opts.gen_tokens + 10 < backend.n_ctx:
            say("measuring prompt-lookup speculative decoding")
            spec = measure_speculation(backend, prompt, gen_tokens=opts.gen_tokens, chat=backend.has_chat_template)
        threads = info.n_threads or 1
        counts = {threads} if opts.load.threads else {1, threads, max(1, threads - 1), physical_cores() or threads}
        say(f"measuring decode on {', '.join(map(str, sorted(counts)))} thread(s), alternated")
        rates = decode_by_threads(backend, counts, gen_tokens=min(opts.gen_tokens, 24), chat=backend.has_chat_template)
    say("measuring memory bandwidth")
    by_threads = measure_by_threads([1, threads])
    bandwidth = by_threads[threads]  # what the decode's threads can pull from memory
    gpu_bw = gpu_memory_bandwidth() if info.gpu_offload_supported or (placement is not None and any(u.device.kind == "gpu" for u in placement.uses)) else None
    kl: dict[str, float] = {}
    if fitted.config.type_k == "f16" and not opts.no_quality:
        say("measuring what q8_0 and q4_0 KV caches cost")
        kl = _kv_kl(path, opts.load.threads)
    report = examine(header, info, fitted.config, stats, fitted.hardware, bandwidth, kl.get("q8_0"), spec,
                     gpu_bandwidth=gpu_bw, bandwidth_by_threads=by_threads, placement=placement)
    report.contention = {**asdict(load), "busy": load.busy, "line": load.words()}
    report.decode_by_threads_tokens_per_s = rates
    b = load.busiest
    tip = thread_action(rates, threads, f"{b.name} (pid {b.pid}) is using {b.cpu_percent:.0f}% of a core" if b is not None else None)
    if tip is not None:
        report.actions = sorted([*report.actions, tip], key=lambda a: -a.gain)[:3]
    report.tune = _tune_advice(opts.model)
    report.kv_types = {
        t: {"max_ctx": fitted.fit.max_ctx_by_kv_type.get(t, 0), "kl_mean": kl.get(t, 0.0 if t == "f16" else None)}
        for t in ("f16", "q8_0", "q4_0")
    }
    if opts.json:
        d = report.to_dict()
        d["kv_q8_0_kl_mean"] = kl.get("q8_0")
        d["memory_check"] = memory_check.to_dict() if memory_check else None
        d["plan"] = fitted.to_dict()  # the figures the load was budgeted with, each with its source
        fmt.print_json(d)
    else:
        print(render(report, fmt.safe(path.name)))
        print("\n" + "\n".join(memory_check.report_lines() if memory_check else ["memory check: n/a (llama.cpp's allocation log was not readable)"]))
    return 0
