"""``localllm chat``: a plain line-by-line chat for scripts and slow terminals.

Each line on stdin is a message; the reply streams to stdout, and a one-line
summary (TTFT, decode rate, ITL, context used, shifts) goes to stderr. ``/clear``
starts over, ``/compact`` replaces the older turns with a summary the model writes
(``--compact-at``: automatically, off by default: a script's conversation goes on
as the sliding window keeps it unless asked), ``/bye`` or end of input quits. ``/image FILE`` attaches a picture
for a vision model, ``/audio FILE`` a sound file for an audio model, ``/file PATH`` a text file or a PDF to the next
message (``files_cli``): refused by name, and before sending when it does not fit the context. With ``--json`` each turn is one
JSON line on stdout instead. When it ends, a text conversation is saved as a
session with its KV cache kept (``chat.resume``), and ``--resume`` goes on with
one without reading it again (``_reopen``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import flags, speculation
from localllm.commands._common import load_request, lora_specs, model_path, plan_load, say
from localllm.errors import InputError, LocalLLMError, UsageError
from localllm.util import fmt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from localllm import runtime
    from localllm.chat.session import ChatSession
    from localllm.chat.sessions import SavedSession
    from localllm.chat.thinking import Fold
    from localllm.engine_api import GenerationStats
    from localllm.flags import Subparsers


NEWEST = ""  # --resume without an ID: this model's newest saved session


def register(sub: Subparsers) -> None:
    p = sub.add_parser("chat", help="a line-by-line chat in the terminal (no TUI); the context shifts instead of filling up")
    flags.add_conversation(p, system_help="system prompt (always kept when the context shifts)")
    p.add_argument("--no-stats", action="store_true", help="no summary line after each reply")
    p.add_argument("--no-prompt-cache", action="store_true", help="do not save or load the system prompt's KV state")
    p.add_argument("--compact-at", type=flags.compact_at, default=None, metavar="FRACTION",
                   help="summarize the older turns with the model once the context is this full (e.g. 0.85), keeping the system "
                        "prompt and the last turns (default: off, the sliding window alone; /compact does it on demand)")
    flags.add_template(p)
    flags.add_load_options(p)
    flags.add_lora(p)
    p.add_argument("--json", action="store_true", help="one JSON line per turn")
    flags.add_vision(p, image=False)
    flags.add_tools(p)
    p.add_argument("--resume", nargs="?", const=NEWEST, default=None, metavar="ID",
                   help="go on with a saved session (default: this model's newest), its kept KV cache loaded instead of reading it again")
    p.add_argument("--no-save", action="store_true", help="do not save the conversation as a session when chat ends")


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
    compact_at: float | None = None  # --compact-at: automatic compaction at this fraction of the context
    resume: str | None = None  # --resume: a saved session's ID, NEWEST for this model's newest
    reasoning: str = "auto"  # -rea: the template's enable_thinking (auto: the renderer's default, on)
    speculate: str = "auto"  # --speculate: draftless speculation's mode
    no_save: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, pull=flags.Pull.from_args(ns), system=ns.system, sampling=flags.Sampling.from_args(ns), no_stats=ns.no_stats,
                   no_prompt_cache=ns.no_prompt_cache, template=ns.template, load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns),
                   json=ns.json, vision=flags.Vision.from_args(ns), tools=flags.Tools.from_args(ns),
                   compact_at=ns.compact_at, resume=ns.resume, no_save=ns.no_save,
                   reasoning=ns.reasoning, speculate=ns.speculate)


def _encode(s: GenerationStats, media: Sequence[object] = ()) -> str:
    """TTFT's encode phase, where this turn encoded an image or a clip: a clip's
    as seconds of audio a second (``audio_cli.encode_row``), so a slow encoder shows."""
    from localllm.commands import audio_cli  # lazy: the audio readers, only once a reply is done

    if not s.images:
        return ""
    clips = audio_cli.clips_of(media)
    if not clips:
        return f" (image encode {fmt.ms(s.encode_ms)})"
    seconds = sum(c.seconds for c in clips)
    rate = seconds / (s.encode_ms / 1000) if s.encode_ms and len(clips) == len(media) else None  # with pictures: not the audio's alone
    return f" ({'audio' if len(clips) == len(media) else 'media'} encode {fmt.ms(s.encode_ms)}, {fmt.num(rate, 1)} s of audio/s)"


def summary(s: GenerationStats, shifts_total: int, forecast: str = "", media: Sequence[object] = ()) -> str:
    return (
        f"TTFT {fmt.ms(s.ttft_ms)}{forecast}{_encode(s, media)} · {fmt.num(s.decode_tokens_per_s, 1)} tokens/s"
        f" · ITL p50 {fmt.ms(s.itl_ms.p50)} p95 {fmt.ms(s.itl_ms.p95)}"
        f" · context {s.context_used}/{s.n_ctx} · shifts {shifts_total}"
    )


def run(args: argparse.Namespace) -> int:
    from localllm.commands import vision_cli  # lazy: the projector's reader loads gguf (~0.1 s), which --help (register above) does not need

    opts = Options.from_args(args)
    saved = _named_session(opts)  # --resume ID: read first, a bad ID said before any load; its model is the default
    opts = _with_session(opts, saved)
    path = model_path(opts.model, opts.pull, opts.load, opts.lora, progress=not opts.json)
    if opts.resume == NEWEST:
        saved = _newest_session(path)
        opts = _with_session(opts, saved)
    mmproj = vision_cli.projector_path(opts.vision, path, quiet=opts.json)  # a projector as the model, or one that does not fit: one line
    request = load_request(opts.load, opts.lora, path, opts.load.ctx, projector=mmproj, template=opts.template,
                           n_outputs=speculation.rows(opts.speculate))
    planned = plan_load(opts.load, request).check()  # does not fit (the model, or its projector beside it): one line, before the load
    interactive = sys.stdin is not None and sys.stdin.isatty() and not opts.json
    if opts.tools.tools:  # the MCP servers first: a failing one is said before the model loads
        from localllm.commands import tools_cli  # lazy: localllm.mcp and the tool-call formats, only with --tools

        with tools_cli.start_hub(opts.tools.tools) as hub:
            return _chat(opts, planned, interactive, hub, saved)
    return _chat(opts, planned, interactive, None, saved)


def _chat(opts: Options, planned: runtime.Planned, interactive: bool, hub, saved: SavedSession | None = None) -> int:
    from localllm import runtime  # lazy: the load path loads gguf (~0.1 s), which --help does not need
    from localllm.chat.session import ChatSession, prompt_cache_path  # lazy: the chat session and its images (~9 ms), which --help does not need
    from localllm.chat.thinking import Fold  # lazy: as above
    from localllm.commands import audio_cli, files_cli, vision_cli  # lazy: as in run

    path, fitted = planned.path, planned.lp
    with runtime.load(planned) as loaded:
        backend = loaded.engine
        if loaded.projector is not None and not opts.json:
            say(f"{'vision' if loaded.projector.has_vision else 'audio'}: {vision_cli.describe(loaded.projector)}")
        if not backend.has_chat_template:
            raise UsageError(f"{path.name} has no chat template (a base model): use localllm run --raw")
        cfg = fitted.config
        cache = None
        if opts.system and not opts.no_prompt_cache and not lora_specs(opts.lora):  # a saved state is of the weights without adapters
            cache = prompt_cache_path(path, opts.system, cfg.type_k, cfg.type_v, cfg.swa_full)
        session = ChatSession(
            backend,
            system_prompt=opts.system,
            sampling=replace(opts.sampling.config(), speculate=opts.speculate),
            thinking=flags.thinking_of(opts.reasoning),
            prompt_cache=cache,
        )
        if saved is not None:
            _reopen(session, saved, adapters=bool(lora_specs(opts.lora)))
        if hub is not None:
            from localllm.commands import tools_cli  # lazy: with --tools only

            chat = tools_cli.tool_chat(session, hub, opts.tools)
        files = files_cli.ChatFiles(backend, fitted, opts.sampling.n_predict, quiet=opts.json, tools=hub is not None)  # /file, the TTFT forecast
        turn_now: dict[str, Any] = {"user": None, "pieces": []}
        attached: list = []  # /image's pictures and /audio's clips, sent with the next message
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
            if text.strip().split(" ", 1)[0] == "/think":
                _think_command(session, text.strip()[len("/think"):].strip())
                continue
            if text.strip() == "/compact":
                _compact(session, opts)
                continue
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
            if text.strip().split(" ", 1)[0] == "/audio":
                if hub is not None:  # as /image: the tool loop would drop the clip unheard
                    say("error: /audio does not go with --tools yet")
                else:
                    audio_cli.audio_command(text.strip()[len("/audio"):].strip(), backend, attached)
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
                images, attached[:] = list(attached), []  # /image's pictures and /audio's clips go with this message
                fold = Fold(backend.template_source, session.reply_opening(), submitted)
                gen = session.send_messages([message], start_ns=submitted, images=images)
                for event in gen:
                    turn_now["pieces"].append(event.text)
                    _show(fold, fold.feed(event.text, event.t_ns), opts.json)
                answer, thought = fold.finish()
                _show(fold, answer, opts.json)
                spec = gen.spec
            turn_now["user"] = None
            turn = session.turns[-1]
            files.observe(turn.stats)
            if opts.json:
                extra: dict[str, Any] = {"reply": reply, "tool_calls": calls} if calls is not None else {}
                if hub is None:
                    extra |= {**thought.to_dict(), "speculative": None if spec is None else
                              {"drafted": spec.drafted, "accepted": spec.accepted, "acceptance": spec.acceptance}}
                print(json.dumps({"user": text, "reply": turn.reply, "prompt_cache_hit": session.prompt_cache_hit, **turn.stats.to_dict(),
                                  **files.json(), **extra}), flush=True)
            else:
                sys.stdout.write("\n")
                sys.stdout.flush()
                if hub is None and thought.tokens is not None and not fold.said:
                    print(thought.line(), file=sys.stderr, flush=True)  # a reply that was all thinking
                if not opts.no_stats:
                    print(summary(turn.stats, len(session.shifts), files.vs(), images if hub is None else ()), file=sys.stderr, flush=True)
                    if hub is None and (thought.answer_ms is not None and thought.tokens is not None or spec is not None and spec.drafted):
                        print(_after(thought, spec), file=sys.stderr, flush=True)
            _compact(session, opts, auto=True)  # --compact-at: once the context is that full
        if not opts.no_save and hub is None:  # a tool conversation's calls and results are not a saved session's messages
            _save_session(session, saved, path, opts, cfg.to_dict())
    return 0


def _compact(session: ChatSession, opts: Options, *, auto: bool = False) -> None:
    """``/compact``, or after a turn once the context is ``--compact-at`` full: the
    older turns summarized by the model (``localllm.compaction``), one line on stderr
    with the tokens before and after and the seconds (a JSON line on stdout with
    --json). A failure is one line, and the chat goes on as it was."""
    from localllm.compaction import KEEP_TURNS, compactable, should_compact  # lazy: as the chat session, which --help does not need
    from localllm.compaction.conversation import compact  # lazy: as above
    from localllm.errors import LocalLLMError

    if auto and not (should_compact(session.context_used, session.n_ctx, opts.compact_at) and compactable(session.messages, KEEP_TURNS)):
        return
    try:
        result = compact(session)
    except LocalLLMError as exc:
        say(f"not compacted: {exc}")
        return
    if result is None:
        say(f"nothing to compact: the conversation is no longer than the {KEEP_TURNS} turns kept whole")
    elif opts.json:
        print(json.dumps({"compaction": {**result.to_dict(), "auto": auto}}), flush=True)
    else:
        say(result.line() + (f" (auto at {opts.compact_at:.0%} of the context)" if auto and opts.compact_at else ""))


def _show(fold: Fold, answer: str, quiet: bool) -> None:
    """The answer's text as it comes; the thinking before it folded into one line on stderr."""
    if quiet or not answer:
        return
    so_far = fold.thinking_so_far()
    if not fold.said and so_far is not None:
        print(so_far.line(), file=sys.stderr, flush=True)
    fold.said = True
    sys.stdout.write(answer)
    sys.stdout.flush()


def _after(thought: Any, spec: Any) -> str:
    """The thinking model's time to its answer, and speculation's count, after the summary line."""
    parts = []
    if thought.answer_ms is not None and thought.tokens is not None:
        parts.append(f"answer after {fmt.ms(thought.answer_ms)} ({thought.tokens} tokens of thinking)")
    if spec is not None and spec.drafted:
        parts.append(f"speculation {speculation.line(spec.drafted, spec.accepted)}")
    return " · ".join(parts)


def _think_command(session: Any, arg: str) -> None:
    """``/think on|off``: the template's enable_thinking from the next message on."""
    if arg not in ("on", "off"):
        say("usage: /think on|off (whether a thinking model thinks before it answers)")
        return
    session.thinking = arg == "on"
    say(f"thinking {arg} from the next message")


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


# -- saved sessions (--resume, and the save when chat ends) -------------------------------------


def _named_session(opts: Options) -> SavedSession | None:
    """``--resume ID``'s session, read before the model loads: an ID with no
    session is a usage error (exit 2); a damaged file, an input error naming it."""
    if not opts.resume:
        return None
    from localllm.chat import sessions  # lazy: the saved sessions' store (uuid, platform: ~11 ms), only with --resume

    try:
        known = sessions.state_path(opts.resume).with_suffix(".json").is_file()
    except InputError:  # a name that cannot be a session's (a path, a leading dot)
        known = False
    if not known:
        raise UsageError(f"--resume {fmt.safe(opts.resume)}: no saved session has that ID (localllm list --sessions lists them)")
    saved = sessions.load(opts.resume)
    if saved.images:
        raise UsageError(f"--resume {fmt.safe(opts.resume)}: that session holds images, which chat cannot read back: open it in the cockpit (localllm tui, F4)")
    return saved


def _newest_session(path: Path) -> SavedSession:
    """``--resume`` without an ID: the newest saved text session of the model ``path``
    (one with images is the cockpit's to reopen)."""
    from localllm.chat import sessions  # lazy: as in _named_session

    for s in sessions.list_sessions():  # newest first
        if not s.images and Path(s.model).resolve() == path.resolve():
            return s
    raise UsageError(f"--resume: no saved session of {fmt.safe(path.name)} (localllm list --sessions lists them): give an ID, or leave it out")


def _with_session(opts: Options, saved: SavedSession | None) -> Options:
    """The options a reopened session goes on with: its model unless one is
    named, and its system prompt (another one typed is refused: the conversation
    was had under its own)."""
    import dataclasses

    if saved is None:
        return opts
    if opts.system is not None and opts.system != saved.system_prompt:
        raise UsageError("--system with --resume: the saved session goes on with its own system prompt; leave --system out")
    return dataclasses.replace(opts, model=opts.model or saved.model, system=saved.system_prompt)


def _reopen(session: ChatSession, saved: SavedSession, *, adapters: bool) -> None:
    """Put ``saved``'s conversation into ``session`` and load its kept KV cache when
    it stands for it (``chat.resume``); one line says whether it was reused or why
    not (the next message then reads the conversation again). A message left
    without its reply (a save mid-reply) is dropped: the next one takes its place."""
    from localllm.chat import resume, sessions  # lazy: as in _named_session

    messages = [dict(m) for m in saved.messages]
    cut = bool(messages) and messages[-1]["role"] == "user"
    if cut:
        messages = messages[:-1]
    saved.messages, session.messages = messages, list(messages)
    if adapters:
        why: str | None = "a LoRA adapter is loaded, and a state file holds the cache of the weights alone"
    elif saved.kv is None:
        why = "none was kept for it"
    else:
        try:
            why = resume.resume(session, sessions.state_path(saved.id), saved.kv)
        except (OSError, LocalLLMError) as exc:
            why = str(exc)
    turns = sum(1 for m in saved.messages if m["role"] == "user")
    head = f"resumed {saved.id} ({turns} turn{'s' if turns != 1 else ''}{'; its last message had no reply and is left out' if cut else ''}): "
    say(head + ("its KV cache was reused, nothing is read again" if why is None
                else f"its KV cache is not reused ({why}): the next message reads the conversation again"))


def _save_session(session: ChatSession, saved: SavedSession | None, path: Path, opts: Options, settings: dict[str, Any]) -> None:
    """Save the conversation as a session (the cockpit's store) with its KV cache
    kept within the disk budget, so ``--resume`` goes on without reading it again.
    Only a text conversation that had a reply this run; a reopened one is written
    over unless ``/clear`` started another (then it is a new session)."""
    from localllm.chat import sessions  # lazy: as in _named_session

    if not session.turns or session.images:  # images: chat keeps no path to read them back from
        return
    if saved is None or session.messages[: len(saved.messages)] != saved.messages:
        saved = sessions.SavedSession.new(str(path), session.system_prompt, settings)
    saved.messages = [dict(m) for m in session.messages]
    saved.kv = None
    kept = False
    try:
        if not lora_specs(opts.lora):  # a state file is of the weights without adapters
            kept = sessions.keep_kv(session, saved)
    except (OSError, LocalLLMError) as exc:
        say(f"the KV cache was not kept: {exc}")
    try:
        sessions.save(saved)
    except (OSError, LocalLLMError) as exc:
        say(f"the chat could not be saved: {exc}")
        return
    if not opts.json:
        say(f"saved as {saved.id}{' with its KV cache' if kept else ''}: localllm chat --resume {saved.id}")
