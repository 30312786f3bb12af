"""``localllm chat``: a plain line-by-line chat for scripts and slow terminals.

Each line on stdin is a message; the reply streams to stdout, and a one-line
summary (TTFT, decode rate, ITL, context used, shifts) goes to stderr. ``/clear``
starts over, ``/bye`` or end of input quits. ``/image FILE`` attaches a picture
for a vision model, ``/file PATH`` a text file or a PDF to the next message (``files_cli``): refused by name, and before
sending when it does not fit the context. With ``--json`` each turn is one
JSON line on stdout instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localllm import flags
from localllm.commands._common import load_request, lora_specs, model_path, plan_load, say
from localllm.errors import UsageError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm import runtime
    from localllm.engine_api import GenerationStats
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("chat", help="a line-by-line chat in the terminal (no TUI); the context shifts instead of filling up")
    flags.add_model(p)
    flags.add_pull_options(p)
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help="system prompt (always kept when the context shifts)")
    flags.add_sampling(p)
    p.add_argument("--no-stats", action="store_true", help="no summary line after each reply")
    p.add_argument("--no-prompt-cache", action="store_true", help="do not save or load the system prompt's KV state")
    flags.add_template(p)
    flags.add_load_options(p)
    flags.add_lora(p)
    p.add_argument("--json", action="store_true", help="one JSON line per turn")
    flags.add_vision(p, image=False)
    flags.add_tools(p)


@dataclass(frozen=True)
class Options:
    model: str | None
    pull: flags.Pull
    system: str | None
    sampling: flags.Sampling
    no_stats: bool
    no_prompt_cache: bool
    template: str | None
    load: flags.Load
    lora: flags.Lora
    json: bool
    vision: flags.Vision
    tools: flags.Tools

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, pull=flags.Pull.from_args(ns), system=ns.system, sampling=flags.Sampling.from_args(ns), no_stats=ns.no_stats,
                   no_prompt_cache=ns.no_prompt_cache, template=ns.template, load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns),
                   json=ns.json, vision=flags.Vision.from_args(ns), tools=flags.Tools.from_args(ns))


def _encode(s: GenerationStats) -> str:
    """TTFT's image-encode phase, where this turn encoded an image."""
    return f" (image encode {fmt.ms(s.encode_ms)})" if s.images else ""


def summary(s: GenerationStats, shifts_total: int, forecast: str = "") -> str:
    return (
        f"TTFT {fmt.ms(s.ttft_ms)}{forecast}{_encode(s)} · {fmt.num(s.decode_tokens_per_s, 1)} tokens/s"
        f" · ITL p50 {fmt.ms(s.itl_ms.p50)} p95 {fmt.ms(s.itl_ms.p95)}"
        f" · context {s.context_used}/{s.n_ctx} · shifts {shifts_total}"
    )


def run(args: argparse.Namespace) -> int:
    from localllm.commands import vision_cli  # lazy: the projector's reader loads gguf (~0.1 s), which --help (register above) does not need

    opts = Options.from_args(args)
    path = model_path(opts.model, opts.pull, opts.load, opts.lora, progress=not opts.json)
    mmproj = vision_cli.projector_path(opts.vision, path, quiet=opts.json)  # a projector as the model, or one that does not fit: one line
    request = load_request(opts.load, opts.lora, path, opts.load.ctx, projector=mmproj, template=opts.template)
    planned = plan_load(opts.load, request).check()  # does not fit (the model, or its projector beside it): one line, before the load
    interactive = sys.stdin is not None and sys.stdin.isatty() and not opts.json
    if opts.tools.tools:  # the MCP servers first: a failing one is said before the model loads
        from localllm.commands import tools_cli  # lazy: localllm.mcp and the tool-call formats, only with --tools

        with tools_cli.start_hub(opts.tools.tools) as hub:
            return _chat(opts, planned, interactive, hub)
    return _chat(opts, planned, interactive, None)


def _chat(opts: Options, planned: runtime.Planned, interactive: bool, hub) -> int:
    from localllm import runtime  # lazy: the load path loads gguf (~0.1 s), which --help does not need
    from localllm.chat.session import ChatSession, prompt_cache_path  # lazy: the chat session and its images (~9 ms), which --help does not need
    from localllm.commands import files_cli, vision_cli  # lazy: as in run

    path, fitted = planned.path, planned.lp
    with runtime.load(planned) as loaded:
        backend = loaded.engine
        if loaded.projector is not None and not opts.json:
            say(f"vision: {vision_cli.describe(loaded.projector)}")
        if not backend.has_chat_template:
            raise UsageError(f"{path.name} has no chat template (a base model): use localllm run --raw")
        cfg = fitted.config
        cache = None
        if opts.system and not opts.no_prompt_cache and not lora_specs(opts.lora):  # a saved state is of the weights without adapters
            cache = prompt_cache_path(path, opts.system, cfg.type_k, cfg.type_v, cfg.swa_full)
        session = ChatSession(
            backend,
            system_prompt=opts.system,
            sampling=opts.sampling.config(),
            prompt_cache=cache,
        )
        if hub is not None:
            from localllm.commands import tools_cli  # lazy: with --tools only

            chat = tools_cli.tool_chat(session, hub, opts.tools)
        files = files_cli.ChatFiles(backend, fitted, opts.sampling.n_predict, quiet=opts.json, tools=hub is not None)  # /file, the TTFT forecast
        turn_now: dict[str, Any] = {"user": None, "pieces": []}
        attached: list = []  # /image's pictures, sent with the next message
        if cfg.rpc_servers:
            _save_if_a_worker_dies(path, opts, cfg, session, turn_now)
        while True:
            if interactive:
                print(">>> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            submitted = time.perf_counter_ns()  # TTFT's clock starts when the line arrives
            if not line:
                break
            text = line.rstrip("\n")
            if not text.strip():
                continue
            if text.strip() in ("/bye", "/exit", "/quit"):
                break
            if text.strip() == "/clear":
                session.clear()
                attached.clear()
                files.pending.clear()
                continue
            if text.strip().split(" ", 1)[0] == "/image":
                if hub is not None:  # the tool loop sends text turns only: an image would be dropped unseen
                    say("error: /image does not go with --tools yet")
                else:
                    vision_cli.image_command(text.strip()[len("/image"):].strip(), backend, attached)
                continue
            if files.command(text):
                continue
            message, refused = files.prepare(session.messages, text, images=len(attached))
            if message is None:
                say(refused or "not sent")
                continue
            turn_now.update(user=text, pieces=[])
            calls = None
            if hub is not None:
                reply, calls = tools_cli.turn(chat, message["content"], start_ns=submitted, quiet=opts.json)
            else:
                images, attached[:] = list(attached), []  # /image's pictures go with this message
                for event in session.send_messages([message], start_ns=submitted, images=images):
                    turn_now["pieces"].append(event.text)
                    if not opts.json:
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
            turn_now["user"] = None
            turn = session.turns[-1]
            files.observe(turn.stats)
            if opts.json:
                extra = {"reply": reply, "tool_calls": calls} if calls is not None else {}
                print(json.dumps({"user": text, "reply": turn.reply, "prompt_cache_hit": session.prompt_cache_hit, **turn.stats.to_dict(),
                                  **files.json(), **extra}), flush=True)
            else:
                sys.stdout.write("\n")
                sys.stdout.flush()
                if not opts.no_stats:
                    print(summary(turn.stats, len(session.shifts), files.vs()), file=sys.stderr, flush=True)
    return 0


def _save_if_a_worker_dies(path, opts: Options, cfg, session, turn_now: dict) -> None:
    """With --rpc, llama.cpp aborts when a worker dies mid-reply: save the chat
    so far (the cut reply included) where the cockpit's sessions live."""
    from localllm.chat import sessions  # lazy: the saved sessions' store (uuid, platform: ~11 ms), only with --rpc

    # lazy: loads llama.cpp (~169 ms here), which chat does not load at import
    from localllm.engine import rpc

    def save(_detail: str) -> str:
        messages = list(session.messages)
        if turn_now["user"] is not None:
            messages += [{"role": "user", "content": turn_now["user"]}, {"role": "assistant", "content": "".join(turn_now["pieces"])}]
        saved = sessions.SavedSession.new(str(path), opts.system, cfg.to_dict())
        saved.messages = messages
        where = sessions.save(saved)
        cut = "the reply is cut short; " if turn_now["user"] is not None else ""
        return f"{cut}the chat is saved in {where}"

    rpc.on_abort(save)
