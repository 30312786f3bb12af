"""``localllm run``: stream a reply, then the timings that tell slow-to-start from slow-to-stream."""

from __future__ import annotations

import argparse
import sys

from localllm import runtime
from localllm.chat.speculative import DraftModel, PromptLookup, generate
from localllm.commands import files_cli, vision_cli
from localllm.commands._common import device_table, load_request, model_path, plan_load, sampling_config, say, template_spec
from localllm.engine_api import Engine, Generation, GenerationStats
from localllm.errors import UsageError
from localllm.modelfile.model_info import describe
from localllm.plan import fitting
from localllm.util import fmt


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        prompt = args.prompt
    elif sys.stdin is not None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    else:
        raise UsageError("no prompt: pass -p TEXT or pipe text on stdin")
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass -p TEXT or pipe text on stdin")
    return prompt


def stats_block(s: GenerationStats) -> str:
    rows = [
        ("load duration", fmt.ms(s.load_ms)),
        ("prompt eval count", f"{s.prompt_tokens} token(s)"),
        ("prompt eval duration", fmt.ms(s.prefill_ms)),
        ("prompt eval rate", f"{fmt.num(s.prefill_tokens_per_s)} tokens/s"),
        ("eval count", f"{s.generated_tokens} token(s)"),
        ("eval duration", fmt.ms(s.decode_ms)),
        ("eval rate", f"{fmt.num(s.decode_tokens_per_s)} tokens/s"),
        *([("image encode", f"{s.images} image(s), {fmt.ms(s.encode_ms)} ({fmt.num(s.images_per_s)} images/s)")] if s.images else []),
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
    attachments = files_cli.read_all(args.file, quiet=args.json)  # a refused file: one line before the model is even resolved
    prompt = files_cli.compose(read_prompt(args), attachments)
    path = model_path(args)
    images, mmproj = vision_cli.prepare(args, path)  # a projector as the model, a bad image: one line before any load
    if args.ignore_eos and args.n_predict < 0:
        raise UsageError("--ignore-eos needs -n N: without an end-of-generation token nothing stops the reply")
    sampling = sampling_config(args, ignore_eos=args.ignore_eos)
    if args.speculate and args.temp != 0:
        raise UsageError("speculative decoding here is greedy: add --temp 0")
    if args.speculate == "draft" and not args.draft:
        raise UsageError("--speculate draft needs --draft MODEL (a smaller model with the same vocabulary)")
    if args.draft and args.speculate != "draft":
        raise UsageError("--draft goes with --speculate draft")
    if getattr(args, "tools", None) and (args.raw or args.speculate):
        raise UsageError("--tools needs the chat template and plain decoding: drop --raw and --speculate")
    request = load_request(args, path, args.ctx, n_outputs=args.draft_k + 1 if args.speculate else None, projector=mmproj,
                           template=template_spec(args))
    planned = plan_load(args, request).check()  # does not fit (the model, or its projector beside it): one line, before the load
    fitted = planned.lp
    if fitted.fit.outcome is not fitting.Outcome.FITS_AS_ASKED or args.vram is not None:
        c = fitted.config
        say(
            f"fitted to {'--vram ' + fmt.size(args.vram) if args.vram else 'this machine'}: context {c.n_ctx}, KV {c.type_k}/{c.type_v}, "
            f"{fitted.fit.plan.n_gpu_layers} layers {'offloaded' if c.rpc_servers else 'on the GPU'} ({fitted.fit.sentence})"
        )
    with runtime.load(planned) as loaded:
        backend, memory_check = loaded.engine, loaded.memory_check
        if loaded.projector is not None and not args.json:
            say(f"vision: {vision_cli.describe(loaded.projector)}")
        if getattr(args, "verbose", False) and not args.json:
            for line in memory_check.report_lines() if memory_check else ["memory check: n/a (llama.cpp's allocation log was not readable)"]:
                say(line)
            for line in vision_cli.memory_lines(backend):
                say(line)
        if attachments:  # the prompt's tokens against the context, before anything is sent
            attachments = files_cli.check_run(backend, fitted, prompt, attachments, args)
        if getattr(args, "tools", None):
            return _run_tools(backend, prompt, sampling, args)
        pieces: list[str] = []
        with (_speculative(backend, prompt, args) if args.speculate
              else backend.stream_images(prompt, images, sampling, chat=not args.raw) if images
              else backend.stream(prompt, sampling, chat=not args.raw)) as gen:
            for event in gen:
                pieces.append(event.text)
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        stats, spec = gen.stats, gen.spec
        assert stats is not None
        if args.json:
            out = {
                "model": str(path),
                "text": "".join(pieces),
                **stats.to_dict(),
                "memory_check": memory_check.to_dict() if memory_check else None,
                "plan": fitted.to_dict(),  # the figures the load was budgeted with, each with its source
                "devices": device_table(fitted, path, backend.logged_buffers, planned.header),
                "lora": [{"id": i, "path": str(p), "scale": sc} for i, (p, sc) in enumerate(backend.adapters)],  # --lora, by id
                "projector": vision_cli.json_block(backend) if mmproj is not None else None,
            }
            if attachments:
                out["attachments"] = files_cli.to_json(attachments)
            if spec is not None:
                out["speculative"] = {"mode": args.speculate, "drafted": spec.drafted, "accepted": spec.accepted, "acceptance": spec.acceptance}
            fmt.print_json(out)
            return 0
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.no_stats:
            print("\n" + stats_block(stats), file=sys.stderr)
            if getattr(args, "verbose", False):
                print("\n".join(threads_lines(stats.threads)), file=sys.stderr)
            if spec is not None:
                print(
                    f"{'speculative:':<22}{args.speculate}, {spec.accepted} of {spec.drafted} drafted tokens accepted ({100 * spec.acceptance:.0f}%)",
                    file=sys.stderr,
                )
    return 0


def _speculative(backend: Engine, prompt: str, args: argparse.Namespace) -> Generation:

    tokens = backend.prompt_tokens(prompt, chat=not args.raw)
    room = backend.n_ctx - len(tokens) - args.draft_k - 2  # speculative decoding does not shift the context
    if args.n_predict > room:
        raise UsageError(f"speculative decoding does not shift the context: raise --ctx above {backend.n_ctx + args.n_predict - room}")
    max_tokens = args.n_predict if args.n_predict > 0 else room
    if args.speculate == "lookup":
        return generate(backend, tokens, PromptLookup(), max_tokens=max_tokens, k=args.draft_k)
    # the draft through the load path too: fitted to what the model left, its context kept (fewer layers on the GPU instead)
    options = fitting.LoadOptions(n_ctx=backend.n_ctx, policy="offload")
    draft = runtime.open_model(runtime.LoadRequest(model=args.draft, options=options, n_outputs=args.draft_k + 1,
                                                   dry_run=not getattr(args, "no_dry_run", False))).engine
    if not _same_vocabulary(backend, draft):
        draft.close()
        raise UsageError("the draft model's vocabulary differs from the model's: pick a draft from the same family")

    def events(out: Generation):
        inner = generate(backend, tokens, DraftModel(draft), max_tokens=max_tokens, k=args.draft_k)
        try:
            yield from inner
        finally:
            inner.close()
            draft.close()
            out.finish(inner.stats, inner.spec)

    return Generation(events)


def _same_vocabulary(a: Engine, b: Engine) -> bool:
    """Same size and the same text for a spread of token ids."""

    if a.header is None or b.header is None:
        return False
    n = describe(a.header).n_vocab
    if n != describe(b.header).n_vocab:
        return False
    probe = {0, 1, 2, n // 7, n // 3, n // 2, n - 1}
    return all(a.token_bytes(t, special=True) == b.token_bytes(t, special=True) for t in probe)


def _run_tools(backend: Engine, prompt: str, sampling, args: argparse.Namespace) -> int:
    """``run --tools``: the prompt as a chat turn whose model may call the MCP
    servers' tools (approved on the terminal, or --yes-tools)."""
    from localllm.chat.session import ChatSession  # lazy: with the line below, only with --tools
    from localllm.commands import tools_cli  # lazy: localllm.mcp and the tool-call formats, only with --tools

    with tools_cli.start_hub(args.tools) as hub:
        session = ChatSession(backend, sampling=sampling)
        chat = tools_cli.tool_chat(session, hub, args)
        text, calls = tools_cli.turn(chat, prompt, start_ns=None, quiet=args.json)
    stats = session.turns[-1].stats if session.turns else None
    if args.json:
        fmt.print_json({"model": str(backend.info.path) if backend.info else None, "text": text, "tool_calls": calls,
                        **(stats.to_dict() if stats else {})})
        return 0
    sys.stdout.write("\n")
    sys.stdout.flush()
    if stats is not None and not args.no_stats:
        print("\n" + stats_block(stats), file=sys.stderr)
    return 0

