"""``localllm quantize``: INT8/INT4 GGUFs from F16/BF16/F32, with a progress bar,
safe writes and a quality report; ``--compare`` puts several files side by side."""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, paths
from localllm.errors import Terminated, UsageError
from localllm.util import fmt
from localllm.util.progress import Bar as ProgressBar

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.quantize.pipeline import Progress, Report
    from localllm.quantize.verdict import Verdict


def register(sub: Subparsers) -> None:
    p = sub.add_parser("quantize", help="make Q8_0/Q4_K_M/... GGUFs from F16/BF16/F32 and report what quality it cost")
    p.add_argument("paths", nargs="*", metavar="INPUT [OUTPUT]",
        help="the source GGUF or a model name, and the output (default: <base>-<TYPE>.gguf beside a path, in localllm's models folder for a name)")
    p.add_argument("--type", default=None, metavar="TYPE", help="Q8_0, Q6_K, Q5_K_M, Q5_0, Q4_K_M, Q4_K_S, Q4_0, IQ4_NL, F16, BF16, ...")
    p.add_argument("--imatrix", default=None, metavar="FILE", help="importance matrix (llama-imatrix GGUF) to guide the rounding")
    p.add_argument("--threads", type=flags.threads, default=None, metavar="N", help="threads (default: all)")
    p.add_argument("--allow-requantize", action="store_true", help="quantize an already quantized file (loses more quality)")
    p.add_argument("--dry-run", action="store_true", help="print the output size, write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--eval", action="store_true", help="measure perplexity, KL divergence and top-1 agreement against the source")
    p.add_argument("--eval-tokens", type=flags.int_at_least(256, "--eval-tokens"), default=None, metavar="N", help="score only the first N tokens of the text")
    p.add_argument("--compare", nargs="+", default=None, metavar="FILE", help="SOURCE Q1 Q2 ...: quality of several files side by side")
    p.add_argument("--json", action="store_true", help="one JSON object (a list with --compare)")


@dataclass(frozen=True)
class Options:
    paths: tuple[str, ...]
    type: str | None
    imatrix: str | None
    threads: int | None
    allow_requantize: bool
    dry_run: bool
    force: bool
    eval: bool
    eval_tokens: int | None
    compare: tuple[str, ...]
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(paths=tuple(ns.paths or ()), type=ns.type, imatrix=ns.imatrix, threads=ns.threads, allow_requantize=ns.allow_requantize,
                   dry_run=ns.dry_run, force=ns.force, eval=ns.eval, eval_tokens=ns.eval_tokens, compare=tuple(ns.compare or ()),
                   json=ns.json)


class Bar:
    """quantize's progress: ``localllm.util.progress.Bar`` (the same kind as pull's), made
    when the first event says how many tensors there are."""

    def __init__(self) -> None:
        self.bar: ProgressBar | None = None

    def update(self, p: Progress) -> None:
        if self.bar is None:
            self.bar = ProgressBar("quantizing", p.total, unit="tensors", done=p.index)
        self.bar.update(p.index, p.tensor)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def render_report(r: Report) -> str:
    lines = [
        f"input   {fmt.safe(r.input)}  {fmt.size(r.input_bytes)}",
        f"output  {fmt.safe(r.output or '')}{' (dry run: would write)' if r.dry_run else ''}  {fmt.size(r.output_bytes)}"
        + (f"  ({100 * r.output_bytes / r.input_bytes:.0f}% of the input)" if r.input_bytes else ""),
        f"type    {r.type}, {r.bits_per_weight:.2f} bits per weight",
        f"time    {r.seconds:.1f} s",
    ]
    if r.tensor_types:
        lines.append("tensors " + ", ".join(f"{t.type} {t.count} ({fmt.size(t.bytes)})" for t in r.tensor_types))
    return "\n".join(lines)


def per_gib(r, size: int) -> float:
    """Top-1 agreement (percent) per GiB of file: what ``--compare`` ranks by,
    the quality a byte of the file buys."""
    return 100 * r.top1_agreement / (size / 2**30) if size else 0.0


def render_quality(rows, sizes: dict[str, tuple[int, float]], verdicts: list[Verdict]) -> str:
    """The table (ranked by quality per GiB when there are several files) and a
    verdict per file, with the source of its bands."""
    from localllm.quantize.verdict import SOURCE  # lazy: the quality bands (~1 ms), which --help (register above) does not need

    ref = rows[0].reference_perplexity if rows else 0
    body = []
    for rank, r in enumerate(rows, 1):
        size, bpw = sizes.get(r.name, (0, 0.0))
        body.append(((f"{rank}. " if len(rows) > 1 else "") + Path(r.name).name, fmt.size(size), f"{bpw:.2f}", f"{r.perplexity:.3f}",
                     f"{r.kl_mean:.5f}", f"{r.kl_p99:.4f}", f"{100 * r.top1_agreement:.2f}%", f"{per_gib(r, size):.1f}"))
    lines = [f"reference perplexity {ref:.3f} on {rows[0].positions if rows else 0} scored tokens", "",
             fmt.table(("file", "size", "bpw", "PPL", "KL mean", "KL p99", "top-1", "top-1 %/GiB"), body, right=range(1, 8)), ""]
    if len(rows) > 1:
        lines.append("ranked by top-1 agreement per GiB of file (the quality a byte buys)")
    lines += [v.text for v in verdicts]
    lines.append(f"bands: {SOURCE}")
    return "\n".join(lines)


def quality_of(src: Path, files: list[Path], opts: Options) -> tuple[list, dict[str, tuple[int, float]], list[Verdict]]:
    """Evaluate ``files`` against ``src`` with a progress bar (chunks done, time
    left; plain lines when piped; none with --json), ranked by quality per GiB,
    each with its verdict."""
    from localllm.modelfile.gguf_file import read_header  # lazy: gguf (~0.1 s), which --help (register above) does not need
    from localllm.modelfile.model_info import describe  # lazy: as above
    from localllm.quantize.evaluate import evaluate  # lazy: numpy and the engine, for --eval and --compare only
    from localllm.quantize.verdict import judge  # lazy: as in render_quality

    bar: ProgressBar | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = ProgressBar("evaluating", total, unit="chunks", enabled=not opts.json)
        bar.update(done)

    try:
        rows = evaluate(src, files, max_tokens=opts.eval_tokens, threads=opts.threads, on_chunk=progress)
    finally:
        if bar is not None:
            bar.close()
    sizes = _sizes(files)
    rows = sorted(rows, key=lambda r: -per_gib(r, sizes[r.name][0]))
    n_params = describe(read_header(src)).n_params
    verdicts = [judge(describe(read_header(r.name)).file_type, r.kl_mean, r.top1_agreement, n_params) for r in rows]
    return rows, sizes, verdicts


def _sizes(paths) -> dict[str, tuple[int, float]]:
    from localllm.modelfile.gguf_file import read_header  # lazy: as in quality_of
    from localllm.modelfile.model_info import describe  # lazy: as in quality_of

    out = {}
    for p in paths:
        info = describe(read_header(p))
        out[str(p)] = (info.size_bytes, info.bits_per_weight)
    return out


def _terminate_cleanly() -> None:
    """SIGTERM unwinds like Ctrl+C, so the partial output is deleted and the
    worker stopped (Python's default would exit without cleaning up)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise Terminated("terminated")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _source(arg: str) -> tuple[Path, bool]:
    """The source file and whether it was found by name (any name ``list``
    shows, a catalog name once pulled) rather than given as a path."""
    from localllm.store import resolver  # lazy: the store loads gguf (~0.1 s), which --help does not need

    if Path(arg).expanduser().exists() or resolver.looks_like_path(arg) and resolver.hub_name(arg) is None:
        return Path(arg).expanduser(), False
    return resolver.resolve(arg), True


def run(args: argparse.Namespace) -> int:
    from localllm.modelfile.gguf_file import read_header  # lazy: as in quality_of
    from localllm.quantize.naming import default_output  # lazy: the output's name (~1 ms), which --help does not need
    from localllm.quantize.pipeline import Job, Progress, dry_report  # lazy: gguf and numpy (~0.1 s), which --help does not need
    from localllm.quantize.pipeline import run as run_job  # lazy: as above

    opts = Options.from_args(args)
    _terminate_cleanly()
    if opts.compare:
        if opts.paths:
            raise UsageError("--compare takes SOURCE and the quantized files itself: localllm quantize --compare SOURCE Q1 Q2")
        if len(opts.compare) < 2:
            raise UsageError("--compare needs a source and at least one quantized file")
        src, *cands = (Path(p) for p in opts.compare)
        for p in (src, *cands):
            read_header(p)
        rows, sizes, verdicts = quality_of(src, list(cands), opts)
        if opts.json:
            fmt.print_json([{**r.to_dict(), "size_bytes": sizes[r.name][0], "top1_percent_per_gib": per_gib(r, sizes[r.name][0]),
                             "rank": i, "verdict": v.to_dict()} for i, (r, v) in enumerate(zip(rows, verdicts), 1)])
        else:
            print(render_quality(rows, sizes, verdicts))
        return 0
    if not opts.paths or len(opts.paths) > 2:
        raise UsageError("give INPUT and optionally OUTPUT: localllm quantize model-F16.gguf --type Q4_K_M")
    if not opts.type:
        raise UsageError("--type is required, e.g. --type Q4_K_M or --type Q8_0")
    src, named = _source(opts.paths[0])
    qtype = opts.type.upper()
    if len(opts.paths) > 1:
        dst = Path(opts.paths[1])
    elif named:
        # a model found by name lives in a store that is not ours (the Hugging Face
        # cache, a package, LM Studio's or Ollama's folder): write into localllm's own
        dst = paths.ensure_dir(paths.models_dir()) / default_output(src, qtype).name
    else:
        dst = default_output(src, qtype)
    job = Job(src, dst, qtype, threads=opts.threads or 0, allow_requantize=opts.allow_requantize, force=opts.force,
              imatrix=Path(opts.imatrix) if opts.imatrix else None)
    if opts.dry_run:
        rep = dry_report(job)
    else:
        bar = None if opts.json else Bar()
        rep = None
        try:
            for event in run_job(job):
                if isinstance(event, Progress):
                    if bar:
                        bar.update(event)
                else:
                    rep = event
        finally:
            if bar:
                bar.close()
        assert rep is not None
    quality = None
    if opts.eval and not opts.dry_run:
        quality = quality_of(src, [dst], opts)
    if opts.json:
        d = rep.to_dict()
        if quality:
            d["quality"] = {**quality[0][0].to_dict(), "verdict": quality[2][0].to_dict()}
        fmt.print_json(d)
    else:
        print(render_report(rep))
        if quality:
            print()
            print(render_quality(*quality))
    return 0
