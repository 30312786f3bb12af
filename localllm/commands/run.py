"""``localllm run``: stream a reply, then the timings that tell slow-to-start from slow-to-stream."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, speculation
from localllm.commands._common import load_request, model_path, plan_load, say
from localllm.errors import UsageError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.engine_api import Engine, Generation, GenerationStats
    from localllm.flags import Subparsers
    from localllm.modelfile.gguf_file import GGUFHeader
    from localllm.plan.prepare import LoadPlan


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "run", help="generate a reply and show TTFT, ITL and throughput",
        description="TTFT runs from the prompt's submission (after the model load) to the first token that prints text: "
        "template, tokenizing, prefill and sampling included; the prefill time is shown on its own.",
    )
    flags.add_model(p)
    flags.add_pull_options(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (default: read stdin)")
    p.add_argument("--file", action="append", default=None, metavar="PATH",
                   help="a text file (code, Markdown, logs, CSV, JSON) or a PDF read into the prompt, in a block with its name; repeat for several")
    flags.add_sampling(p)
    p.add_argument("--raw", action="store_true", help="complete the prompt as-is, without the chat template")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-generation token (as llama.cpp's --ignore-eos; with -n N)")
    flags.add_template(p)
    p.add_argument("--no-stats", action="store_true", help="do not print the stats block")
    flags.add_speculate(p, draft=True)
    p.add_argument("--draft", default=None, metavar="MODEL", help="the draft model for --speculate draft (same vocabulary)")
    p.add_argument("--draft-k", type=flags.int_at_least(1, "--draft-k", 64), default=8, metavar="N", help="tokens drafted per step (default: 8)")
    flags.add_load_options(p)
    flags.add_lora(p)
    p.add_argument("--json", action="store_true", help="one JSON object with the text and the stats")
    flags.add_vision(p, image=True, audio=True)
    flags.add_tools(p)


@dataclass(frozen=True)
class Options:
    model: str | None
    pull: flags.Pull
    prompt: str | None
    file: tuple[str, ...]
    sampling: flags.Sampling
    raw: bool
    ignore_eos: bool
    template: str | None
    no_stats: bool
    speculate: str  # auto, lookup, none, draft (--speculate)
    draft: str | None
    draft_k: int
    load: flags.Load
    lora: flags.Lora
    json: bool
    vision: flags.Vision
    tools: flags.Tools
    verbose: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, pull=flags.Pull.from_args(ns), prompt=ns.prompt, file=tuple(ns.file or ()),
                   sampling=flags.Sampling.from_args(ns), raw=ns.raw, ignore_eos=ns.ignore_eos, template=ns.template, no_stats=ns.no_stats,
                   speculate=ns.speculate, draft=ns.draft, draft_k=ns.draft_k, load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns),
                   json=ns.json, vision=flags.Vision.from_args(ns), tools=flags.Tools.from_args(ns), verbose=ns.verbose)

    def template_spec(self) -> str | None:
        """``--template FILE|NAME``: the chat template to use instead of the model's."""
        if self.template is not None and self.raw:
            raise UsageError("--raw uses no chat template: drop --template, or drop --raw")
        return self.template


def read_prompt(opts: Options) -> str:
    if opts.prompt is not None:
        prompt = opts.prompt
    elif sys.stdin is not None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    else:
        raise UsageError("no prompt: pass -p TEXT or pipe text on stdin")
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass -p TEXT or pipe text on stdin")
    return prompt


def stats_block(s: GenerationStats, media: Sequence[object] = ()) -> str:
    from localllm.commands import audio_cli  # lazy: the audio readers, only once a reply is done

    rows = [
        ("load duration", fmt.ms(s.load_ms)),
        ("prompt eval count", f"{s.prompt_tokens} token(s)"),
        ("prompt eval duration", fmt.ms(s.prefill_ms)),
        ("prompt eval rate", f"{fmt.num(s.prefill_tokens_per_s)} tokens/s"),
        ("eval count", f"{s.generated_tokens} token(s)"),
        ("eval duration", fmt.ms(s.decode_ms)),
        ("eval rate", f"{fmt.num(s.decode_tokens_per_s)} tokens/s"),
        *([audio_row] if (audio_row := audio_cli.encode_row(s, media)) else
          [("image encode", f"{s.images} image(s), {fmt.ms(s.encode_ms)} ({fmt.num(s.images_per_s)} images/s)")] if s.images else []),
        ("time to first token", fmt.ms(s.ttft_ms)),
        ("inter-token latency", f"p50 {fmt.ms(s.itl_ms.p50)}, p95 {fmt.ms(s.itl_ms.p95)}, max {fmt.ms(s.itl_ms.max)}"),
        ("total duration", fmt.ms(s.total_ms)),
    ]
    return "\n".join(f"{k + ':':<22}{v}" for k, v in rows)


def threads_lines(threads: dict | None) -> list[str]:
    """``run -v``'s account of the decode threads (``GenerationStats.threads``):
    the count per kind of step, where it started and why, and each change."""
    if not threads:
        return ["threads: n/a (this generation did not choose them)"]
    now = ", ".join(f"{kind} {n}" for kind, n in threads["now"].items()) or str(threads["start"])
    if threads["mode"] == "fixed":
        return [f"threads: {now}, fixed by --threads"]
    out = [f"threads: {now} (adaptive from {threads['start']}: {threads['why_start']}; {threads['probes']} probe steps so far)"]
    for c in threads["changes"]:
        at = f" at {c['at_s']:.2f} s" if c.get("at_s") is not None else ""
        out.append(f"threads: {c['kind']}{at}: {c['line']}")
    return out


def run(args: argparse.Namespace) -> int:
    # lazy: the load path, the engine's API and attachments load gguf (~0.1 s), which --help (register above) does not need
    from localllm import runtime
    from localllm.commands import audio_cli, files_cli, vision_cli  # lazy: as above
    from localllm.plan import fitting  # lazy: as above

    opts = Options.from_args(args)
    attachments = files_cli.read_all(list(opts.file) or None, quiet=opts.json)  # a refused file: one line before the model is even resolved
    prompt = files_cli.compose(read_prompt(opts), attachments)
    path = model_path(opts.model, opts.pull, opts.load, opts.lora, progress=not opts.json)
    # a projector as the model, a bad image: one line before any load
    images, mmproj = vision_cli.prepare(opts.vision, path, quiet=opts.json, alone=not (opts.speculate == "draft" or opts.tools.tools))
    if opts.ignore_eos and opts.sampling.n_predict < 0:
        raise UsageError("--ignore-eos needs -n N: without an end-of-generation token nothing stops the reply")
    sampling = replace(opts.sampling.config(ignore_eos=opts.ignore_eos), speculate=opts.speculate if opts.speculate != "draft" else "none")
    if opts.speculate == "draft" and opts.sampling.temp != 0:
        raise UsageError("speculative decoding with a draft model is greedy: add --temp 0 (or leave --speculate auto: drafts from the text, any sampler)")
    if opts.speculate == "draft" and not opts.draft:
        raise UsageError("--speculate draft needs --draft MODEL (a smaller model with the same vocabulary)")
    if opts.draft and opts.speculate != "draft":
        raise UsageError("--draft goes with --speculate draft")
    if opts.tools.tools and (opts.raw or opts.speculate == "draft"):
        raise UsageError("--tools needs the chat template and no draft model: drop --raw and --speculate draft")
    rows = opts.draft_k + 1 if opts.speculate == "draft" else speculation.rows(opts.speculate)  # rows of logits for the drafts
    request = load_request(opts.load, opts.lora, path, opts.load.ctx, n_outputs=rows,
                           projector=mmproj,
                           template=opts.template_spec())
    planned = plan_load(opts.load, request).check()  # does not fit (the model, or its projector beside it): one line, before the load
    fitted = planned.lp
    if fitted.fit.outcome is not fitting.Outcome.FITS_AS_ASKED or opts.load.vram is not None:
        c = fitted.config
        say(
            f"fitted to {'--vram ' + fmt.size(opts.load.vram) if opts.load.vram else 'this machine'}: context {c.n_ctx}, KV {c.type_k}/{c.type_v}, "
            f"{fitted.fit.plan.n_gpu_layers} layers {'offloaded' if c.rpc_servers else 'on the GPU'} ({fitted.fit.sentence})"
        )
    with runtime.load(planned) as loaded:
        backend, memory_check = loaded.engine, loaded.memory_check
        if loaded.projector is not None and not opts.json:
            say(f"{'vision' if loaded.projector.has_vision else 'audio'}: {vision_cli.describe(loaded.projector)}")
        if opts.verbose and not opts.json:
            for line in memory_check.report_lines() if memory_check else ["memory check: n/a (llama.cpp's allocation log was not readable)"]:
                say(line)
            for line in vision_cli.memory_lines(backend):
                say(line)
        if attachments:  # the prompt's tokens against the context, before anything is sent
            attachments = files_cli.check_run(backend, fitted, prompt, attachments, raw=opts.raw, n_predict=opts.sampling.n_predict,
                                                 tools=bool(opts.tools.tools), quiet=opts.json)
        if opts.tools.tools:
            return _run_tools(backend, prompt, sampling, opts)
        pieces: list[str] = []
        with (_speculative(backend, prompt, opts) if opts.speculate == "draft"
              else backend.stream_images(prompt, images, sampling, chat=not opts.raw) if images
              else backend.stream(prompt, sampling, chat=not opts.raw)) as gen:
            for event in gen:
                pieces.append(event.text)
                if not opts.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        stats, spec = gen.stats, gen.spec
        assert stats is not None
        if opts.json:
            out = {
                "model": str(path),
                "text": "".join(pieces),
                **stats.to_dict(),
                "memory_check": memory_check.to_dict() if memory_check else None,
                "plan": fitted.to_dict(),  # the figures the load was budgeted with, each with its source
                "devices": device_table(fitted, path, backend.logged_buffers, planned.header),
                "lora": [{"id": i, "path": str(p), "scale": sc} for i, (p, sc) in enumerate(backend.adapters)],  # --lora, by id
                "projector": vision_cli.json_block(backend) if mmproj is not None else None,
                "audio": audio_cli.json_block(stats, images),  # --audio's clips and their encode phase (null without)
            }
            if attachments:
                out["attachments"] = files_cli.to_json(attachments)
            out["speculative"] = {"mode": opts.speculate, "drafted": spec.drafted, "accepted": spec.accepted,
                                  "acceptance": spec.acceptance} if spec is not None else {"mode": opts.speculate, "drafted": None,
                                                                                           "accepted": None, "acceptance": None}
            fmt.print_json(out)
            return 0
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not opts.no_stats:
            print("\n" + stats_block(stats, images), file=sys.stderr)
            if opts.verbose:
                print("\n".join(threads_lines(stats.threads)), file=sys.stderr)
            if spec is not None and (opts.verbose or opts.speculate != "auto"):
                print(f"{'speculative:':<22}{opts.speculate}, {speculation.line(spec.drafted, spec.accepted)}", file=sys.stderr)
    return 0


def _speculative(backend: Engine, prompt: str, opts: Options) -> Generation:
    from localllm import runtime  # lazy: as in run
    from localllm.chat.speculative import DraftModel, generate  # lazy: as above
    from localllm.engine_api import Generation  # lazy: as above
    from localllm.plan import fitting  # lazy: as above

    tokens = backend.prompt_tokens(prompt, chat=not opts.raw)
    room = backend.n_ctx - len(tokens) - opts.draft_k - 2  # speculative decoding does not shift the context
    if opts.sampling.n_predict > room:
        raise UsageError(f"speculative decoding does not shift the context: raise --ctx above {backend.n_ctx + opts.sampling.n_predict - room}")
    max_tokens = opts.sampling.n_predict if opts.sampling.n_predict > 0 else room
    # the draft through the load path too: fitted to what the model left, its context kept (fewer layers on the GPU instead)
    options = fitting.LoadOptions(n_ctx=backend.n_ctx, policy="offload")
    draft = runtime.open_model(runtime.LoadRequest(model=opts.draft, options=options, n_outputs=opts.draft_k + 1,
                                                   dry_run=not opts.load.no_dry_run)).engine
    if not _same_vocabulary(backend, draft):
        draft.close()
        raise UsageError("the draft model's vocabulary differs from the model's: pick a draft from the same family")

    def events(out: Generation):
        inner = generate(backend, tokens, DraftModel(draft), max_tokens=max_tokens, k=opts.draft_k)
        try:
            yield from inner
        finally:
            inner.close()
            draft.close()
            out.finish(inner.stats, inner.spec)

    return Generation(events)


def _same_vocabulary(a: Engine, b: Engine) -> bool:
    """Same size and the same text for a spread of token ids."""
    from localllm.modelfile.model_info import describe  # lazy: as in run

    if a.header is None or b.header is None:
        return False
    n = describe(a.header).n_vocab
    if n != describe(b.header).n_vocab:
        return False
    probe = {0, 1, 2, n // 7, n // 3, n // 2, n - 1}
    return all(a.token_bytes(t, special=True) == b.token_bytes(t, special=True) for t in probe)


def _run_tools(backend: Engine, prompt: str, sampling, opts: Options) -> int:
    """``run --tools``: the prompt as a chat turn whose model may call the MCP
    servers' tools (approved on the terminal, or --yes-tools)."""
    from localllm.chat.session import ChatSession  # lazy: with the line below, only with --tools
    from localllm.commands import tools_cli  # lazy: localllm.mcp and the tool-call formats, only with --tools

    assert opts.tools.tools is not None  # run calls this with --tools only
    with tools_cli.start_hub(opts.tools.tools) as hub:
        session = ChatSession(backend, sampling=sampling)
        chat = tools_cli.tool_chat(session, hub, opts.tools)
        text, calls = tools_cli.turn(chat, prompt, start_ns=None, quiet=opts.json)
    stats = session.turns[-1].stats if session.turns else None
    if opts.json:
        fmt.print_json({"model": str(backend.info.path) if backend.info else None, "text": text, "tool_calls": calls,
                        **(stats.to_dict() if stats else {})})
        return 0
    sys.stdout.write("\n")
    sys.stdout.flush()
    if stats is not None and not opts.no_stats:
        print("\n" + stats_block(stats), file=sys.stderr)
    return 0



def device_table(fitted: LoadPlan, path: Path, logged: dict | None = None, header: GGUFHeader | None = None) -> list[dict]:
    """Per device (workers' devices, a local GPU, the CPU): the planned weights,
    KV, compute and output bytes and the free memory; with ``logged`` (the engine's
    ``logged_buffers``) also what llama.cpp printed for each, in MiB. ``header``:
    the file's, read already for the fit."""
    from localllm.modelfile.gguf_file import read_header  # lazy: as in run
    from localllm.plan import placement, planner  # lazy: as in run

    pl = fitted.placement
    if pl is None:
        header = header if header is not None else read_header(path)
        shape = planner.ModelShape.from_header(header)
        hw = fitted.hardware
        devices = [placement.Device(hw.gpu_name or "GPU", "gpu", hw.gpu_budget, hw.gpu_total_bytes)] if hw.gpu_budget is not None else []
        cpu = placement.Device("CPU", "cpu", hw.ram_available_bytes, hw.ram_total_bytes)
        pl = placement.place(shape, fitted.config, devices, cpu, header=header)
    rows = pl.to_list()
    for r in rows:
        r["logged_mib"] = (logged or {}).get(r["name"]) if logged is not None else None
    return rows
