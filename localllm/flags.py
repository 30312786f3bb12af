"""The flags several commands share, and the typed options they parse into.

A top-level module under the command-line modules (``localllm.commands``, the
cockpit's ``tui.cli``, ``quantize.cli``: packages that may not import each other)
and above the core, which never imports argparse.

Each command declares its own flags (its module's ``register``) and reads them as
a frozen options object built once from the parsed namespace; the groups here
(the model, sampling, load options, LoRA, vision, tools, pulling) are the ones
more than one command declares, so that their spelling, help and defaults are
one. This module is imported by ``localllm --help``: nothing heavy at import
(see ``localllm.cli``'s docstring).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from localllm.engine_api.llama_rules import FLASH_ATTN_MODES, KV_CACHE_TYPES
from localllm.engine_api.records import MAX_SEED, SamplingConfig
from localllm.errors import EXIT_USAGE, UsageError
from localllm.util.units import Size, parse_size

if TYPE_CHECKING:
    from localllm.plan.workers import Endpoint

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]  # noqa: SLF001 - argparse's type of add_subparsers()


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Upper bounds, so that no value reaches llama.cpp's 32-bit fields wrapped or
# one of its asserts: contexts and batches as engine.MAX_CTX (duplicated here so
# that --help does not import llama_cpp), GPU layers as an int32.
MAX_CTX = 1 << 24
MAX_INT32 = 0x7FFFFFFF


def int_at_least(lo: int, what: str, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{what} must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"{what} must be at most {hi}, got {value}")
        return value

    return parse


def threads(text: str) -> int:
    """At most this machine's logical CPUs (and ggml's GGML_MAX_N_THREADS, 512):
    more threads than CPUs only slows llama.cpp down, and thousands crash it."""
    limit = max(1, min(os.cpu_count() or 1, 512))
    value = int_at_least(1, "--threads")(text)
    if value > limit:
        raise argparse.ArgumentTypeError(f"--threads must be at most {limit} (this machine's logical CPUs), got {value}")
    return value


def gen_tokens(text: str) -> int:
    value = int_at_least(-1, "-n")(text)
    if value == 0:
        raise argparse.ArgumentTypeError("-n must be -1 (until the model stops) or at least 1")
    return value


def port(text: str) -> int:
    value = int_at_least(0, "--port")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"--port must be at most 65535, got {value}")
    return value


def nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def float_in(lo: float, hi: float | None, what: str, *, above: bool = False) -> Callable[[str], float]:
    """A finite number from ``lo`` (excluded with ``above``) to ``hi``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {text}")
        if value < lo or (above and value == lo) or (hi is not None and value > hi):
            span = f"from {lo:g} to {hi:g}" if hi is not None else f"above {lo:g}" if above else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(f"{what} must be {span}, got {text}")
        return value

    return parse


def int_list(text: str) -> list[int]:
    parse = int_at_least(1, "each value", MAX_CTX)
    values = [parse(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one value, e.g. 128,512")
    return values


def rpc(text: str) -> list[Endpoint]:
    from localllm.plan.workers import parse_endpoints  # lazy: the RPC client (socket, ipaddress: ~6 ms), only when --rpc is given

    try:
        return parse_endpoints(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size(text: str) -> Size:
    """A ``units.Size``: bytes that remember the unit typed, to be shown in it."""
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- the model ---------------------------------------------------------------


def add_model(p: argparse.ArgumentParser, *, long_flag: bool = True, default: str = "smollm2") -> None:
    """MODEL and ``-m`` (llama.cpp's spelling): one, ``cli`` merges them into ``model``."""
    p.add_argument("model", nargs="?", default=None,
        help="a name from localllm list (smollm2, gemma3-270m, llama-3.2-1b-instruct:q4_k_m, ...) or a path to a "
        f".gguf file; default: {default}")
    p.add_argument(*(("-m", "--model") if long_flag else ("-m",)), dest="model_flag", default=None, metavar="MODEL",
                   help="the model, as llama.cpp's -m")


@dataclass(frozen=True)
class Pull:
    """run, chat, tui, serve: what to do with a Hub name that is not downloaded."""

    yes: bool
    no_pull: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Pull:
        return cls(yes=ns.yes, no_pull=ns.no_pull)


def add_pull_options(p: argparse.ArgumentParser) -> None:
    """run, chat, tui, serve: a Hub name that is not downloaded is pulled first."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--yes", "-y", action="store_true", help="pull a model that is not downloaded without asking")
    g.add_argument("--no-pull", action="store_true", help="never download: a model that is not here is an error")


# --- sampling ----------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """The sampling flags (``add_sampling``), each already in range."""

    temp: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    seed: int
    n_predict: int
    reasoning_budget: int = -1

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Sampling:
        return cls(temp=ns.temp, top_k=ns.top_k, top_p=ns.top_p, min_p=ns.min_p, repeat_penalty=ns.repeat_penalty, seed=ns.seed,
                   n_predict=ns.n_predict, reasoning_budget=ns.reasoning_budget)

    def config(self, *, ignore_eos: bool = False) -> SamplingConfig:
        """The sampling the flags ask for."""
        return SamplingConfig(temperature=self.temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              repeat_penalty=self.repeat_penalty, seed=self.seed, max_tokens=self.n_predict, ignore_eos=ignore_eos,
                              reasoning_budget=self.reasoning_budget)


def add_sampling(p: argparse.ArgumentParser) -> None:
    """The sampling flags of run, chat and tui, with the one set of defaults
    (``SamplingConfig``'s: llama.cpp's own); read as ``Sampling``."""
    d = SamplingConfig()
    g = p.add_argument_group("sampling (defaults: llama.cpp's)")
    g.add_argument("-n", "--n-predict", "--max-tokens", type=gen_tokens, default=d.max_tokens, metavar="N",
                   help="most tokens per reply, -1 until the model stops or the context is full (default: -1)")
    g.add_argument("--temp", type=nonneg_float, default=d.temperature, metavar="T", help=f"temperature, 0 for greedy (default: {d.temperature})")
    g.add_argument("--top-k", type=int_at_least(0, "--top-k", MAX_INT32), default=d.top_k, metavar="K",
                   help=f"keep the K likeliest tokens, 0 for all (default: {d.top_k})")
    g.add_argument("--top-p", type=float_in(0, 1, "--top-p"), default=d.top_p, metavar="P",
                   help=f"keep the likeliest tokens up to this total probability, 1 for all (default: {d.top_p})")
    g.add_argument("--min-p", type=float_in(0, 1, "--min-p"), default=d.min_p, metavar="P",
                   help=f"drop tokens below P times the likeliest one's probability, 0 for none (default: {d.min_p})")
    g.add_argument("--repeat-penalty", type=float_in(0, None, "--repeat-penalty", above=True), default=d.repeat_penalty, metavar="R",
                   help=f"make tokens seen in the last 64 less likely by a factor R, 1 for off (default: {d.repeat_penalty})")
    g.add_argument("--seed", "-s", type=int_at_least(0, "--seed", MAX_SEED), default=d.seed, metavar="N", help="sampling seed (default: random)")
    g.add_argument("--reasoning-budget", type=int_at_least(-1, "--reasoning-budget", MAX_INT32), default=d.reasoning_budget, metavar="N",
                   help="a thinking model's most tokens of thinking, then its end-of-thinking marker is forced and the answer follows: "
                        "-1 unlimited, 0 no thinking (llama.cpp's flag; default: -1)")


def compact_at(text: str) -> float | None:
    """``--compact-at``'s value (``compaction.parse_fraction``), its error as argparse shows one (chat, tui, serve)."""
    from localllm.compaction import parse_fraction  # lazy: read only when the flag is given

    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_speculate(p: argparse.ArgumentParser, *, draft: bool = False) -> None:
    """Draftless speculation's mode (``localllm.speculation``), for run, chat and tui; run also takes a draft model."""
    extra = ", or draft: a --draft model (greedy, --temp 0)" if draft else ""
    p.add_argument("--speculate", choices=("auto", "lookup", "none", "draft") if draft else ("auto", "lookup", "none"), default="auto",
                   help="speculative decoding from the text itself (n-grams of the prompt and the reply), the reply unchanged for any sampler: "
                        f"auto drafts while drafts pay (default), lookup always, none never{extra}")


def add_reasoning(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Whether a thinking model thinks (llama.cpp's ``-rea``), for serve, chat and tui."""
    p.add_argument("-rea", "--reasoning", choices=("on", "off", "auto"), default="auto",
                   help="whether a thinking model thinks: the template's enable_thinking (auto: where its template has a thinking format); "
                        "in serve a request's reasoning_effort or chat_template_kwargs can change it, in chat /think on|off (llama.cpp's flag)")


def thinking_of(reasoning: str) -> bool | None:
    """``--reasoning`` as the template's enable_thinking; None (auto): the renderer's default."""
    return None if reasoning == "auto" else reasoning == "on"


def add_conversation(p: argparse.ArgumentParser, *, system_help: str) -> None:
    """The flags chat and tui open with, in this order: the model and its pull, the
    system prompt, the sampling, the thinking and the speculation."""
    add_model(p)
    add_pull_options(p)
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help=system_help)
    add_sampling(p)
    add_reasoning(p)
    add_speculate(p)


# --- load options ------------------------------------------------------------


class Typed(argparse.Action):
    """Stores the value and notes that the user typed the option (``ctx_typed``),
    so a warning about the value is given for the user's choice, not a default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_typed", True)


# what a --ctx left out asks for (plan.fitting.default_ctx decides it, and fits it: it may shrink)
RUN_CTX = "the model's trained context, at most 4096"
SERVE_CTX = "the model's trained context, or the largest that fits with --parallel of them"


@dataclass(frozen=True)
class Load:
    """The load options (``add_load_options``); those a command does not declare
    (``--rpc``, ``--vram``, ``--policy``, ``--no-dry-run``) hold their defaults."""

    ctx: int | None
    ctx_typed: bool  # --ctx was given (typed or by the config file), not left to the plan
    threads: int | None
    ngl: int | None
    kv_type: str | None
    k_type: str | None
    v_type: str | None
    flash_attn: str
    swa_full: bool
    n_cpu_moe: int | None
    batch: int
    ubatch: int
    rpc: tuple[Endpoint, ...]
    vram: Size | None
    policy: str
    no_dry_run: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Load:
        return cls(ctx=ns.ctx, ctx_typed=ns.ctx_typed, threads=ns.threads, ngl=ns.ngl, kv_type=ns.kv_type, k_type=ns.k_type, v_type=ns.v_type,
                   flash_attn=ns.flash_attn, swa_full=ns.swa_full, n_cpu_moe=ns.n_cpu_moe, batch=ns.batch, ubatch=ns.ubatch,
                   rpc=tuple(ns.rpc or ()), vram=ns.vram, policy=ns.policy, no_dry_run=ns.no_dry_run)


def add_load_options(p: argparse.ArgumentParser, *, fit: bool = True, with_rpc: bool = True,
                     ctx_help: str = f"context size in tokens (default: {RUN_CTX})") -> None:
    """The load options, read as ``Load``; ``fit``: --vram, --policy and --no-dry-run; ``with_rpc``: --rpc."""
    g = p.add_argument_group("load options")
    # no default: None lets the plan decide (plan.fitting.default_ctx), the one place the default context is chosen
    g.add_argument("--ctx", "-c", "--ctx-size", type=int_at_least(1, "--ctx", MAX_CTX), default=None, metavar="N", action=Typed,
                   help=ctx_help)
    g.add_argument("--threads", "-t", type=threads, default=None, metavar="N",
                   help="CPU threads, fixed (default: chosen as it decodes, starting from the fast physical cores)")
    g.add_argument("--ngl", "-ngl", "--n-gpu-layers", "--gpu-layers", type=int_at_least(-1, "--ngl", MAX_INT32), default=None, metavar="N",
        help="layers to offload to the GPU, -1 for all (default: all, or what fits --vram)")
    g.add_argument("--kv-type", choices=KV_CACHE_TYPES, default=None, metavar="T", help=f"K and V cache type: {', '.join(KV_CACHE_TYPES)} (default: f16)")
    g.add_argument("--k-type", "-ctk", "--cache-type-k", choices=KV_CACHE_TYPES, default=None, metavar="T", help="K cache type alone")
    g.add_argument("--v-type", "-ctv", "--cache-type-v", choices=KV_CACHE_TYPES, default=None, metavar="T",
                   help="V cache type alone (quantized needs flash attention)")
    g.add_argument("--flash-attn", "-fa", choices=FLASH_ATTN_MODES, default="auto", help="flash attention (default: auto; a quantized V cache needs it)")
    g.add_argument("--swa-full", action="store_true", help="full-size cache for sliding-window layers (more memory; the cache can shift)")
    moe = g.add_mutually_exclusive_group()
    moe.add_argument("--cpu-moe", "-cmoe", action="store_const", const=-1, dest="n_cpu_moe", default=None,
                     help="keep every layer's expert weights (mixture of experts) in RAM; the rest of each layer is offloaded")
    moe.add_argument("--n-cpu-moe", "-ncmoe", type=int_at_least(0, "--n-cpu-moe", MAX_INT32), dest="n_cpu_moe", metavar="N",
                     help="keep the expert weights of the first N layers in RAM (as llama.cpp's --n-cpu-moe; default: none, "
                     "or as many as a mixture of experts needs to fit --vram)")
    g.add_argument("--batch", "-b", "--batch-size", type=int_at_least(1, "--batch", MAX_CTX), default=512, metavar="N",
                   help="logical batch for prompt processing (default: 512)")
    g.add_argument("--ubatch", "-ub", "--ubatch-size", type=int_at_least(1, "--ubatch", MAX_CTX), default=512, metavar="N",
        help="physical batch: sizes the compute buffer (default: 512)")
    if with_rpc:
        g.add_argument("--rpc", type=rpc, default=None, metavar="HOST:PORT[,...]",
            help="also use the devices of these workers (localllm worker on each machine); no authentication: trusted "
            "networks only")
    if fit:
        g.add_argument("--vram", type=size, default=None, metavar="SIZE",
            help="GPU memory budget: 4GiB (4·2³⁰ bytes), 6GB (6·10⁹), 512MiB; a bare number is GiB (default: detected)")
        g.add_argument("--policy", choices=("ctx", "offload"), default="ctx",
            help="when it does not fit: shrink the context first (ctx, default) or offload fewer layers (offload)")
        g.add_argument("--no-dry-run", action="store_true",
            help="skip llama.cpp's dry run of the load, the referee for compute and output buffers where the graph replay "
            "does not cover the model (about 0.4 s)")
    # what a command does not declare reads as its default (no help line: set_defaults adds no option)
    p.set_defaults(ctx_typed=False, **({} if with_rpc else {"rpc": None}),
                   **({} if fit else {"vram": None, "policy": "ctx", "no_dry_run": False}))


# --- LoRA adapters -----------------------------------------------------------


class LoraAction(argparse.Action):
    """llama-server's ``--lora FNAME[,FNAME]`` (scale 1) and ``--lora-scaled
    FNAME:SCALE[,...]``, repeatable, into one list of (path, scale) in the order
    given: an adapter's id is its place in it, as in llama-server."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None) -> None:
        from localllm.modelfile.lora import parse_scaled  # lazy: loads gguf and numpy, which cli does not load at import

        text = str(values)
        try:
            got = parse_scaled(text) if option == "--lora-scaled" else [(f, 1.0) for f in text.split(",") if f]
        except ValueError as exc:
            parser.error(f"{option}: {exc} (FNAME:SCALE[,FNAME:SCALE...])")
        if not got:
            parser.error(f"{option}: no adapter file given")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *got])


@dataclass(frozen=True)
class Lora:
    """``--lora``/``--lora-scaled`` as given (path, scale), and ``--lora-init-without-apply``."""

    adapters: tuple[tuple[str, float], ...]
    init_without_apply: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Lora:
        return cls(adapters=tuple(ns.lora or ()), init_without_apply=ns.lora_init_without_apply)

    def __bool__(self) -> bool:
        """Whether any LoRA flag was given."""
        return bool(self.adapters) or self.init_without_apply


NO_LORA = Lora(adapters=(), init_without_apply=False)  # a command that takes no --lora (doctor, bench)


def add_lora(p: argparse.ArgumentParser) -> None:
    """LoRA adapters, with llama-server's spellings (run, chat, serve, plan, the cockpit); read as ``Lora``."""
    g = p.add_argument_group("LoRA adapters (llama-server's flags)")
    g.add_argument("--lora", action=LoraAction, dest="lora", default=None, metavar="FNAME[,FNAME]",
                   help="a LoRA adapter GGUF to apply at scale 1 (repeatable; commas for several)")
    g.add_argument("--lora-scaled", action=LoraAction, dest="lora", metavar="FNAME:SCALE[,...]",
                   help="a LoRA adapter GGUF with its scale (repeatable; commas for several)")
    g.add_argument("--lora-init-without-apply", action="store_true",
                   help="load the adapters at scale 0 (serve: set them later with POST /lora-adapters or a request's lora)")


# --- vision, tools, template -------------------------------------------------


@dataclass(frozen=True)
class Vision:
    """``--mmproj``, ``--no-mmproj``, (run, bench) ``--image`` and (run) ``--audio``."""

    mmproj: str | None
    no_mmproj: bool
    images: tuple[str, ...]
    audio: tuple[str, ...] = ()  # sound files for an audio projector (audio.read)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Vision:
        return cls(mmproj=ns.mmproj, no_mmproj=ns.no_mmproj, images=tuple(ns.image or ()), audio=tuple(getattr(ns, "audio", None) or ()))


def add_vision(p: argparse.ArgumentParser, *, image: bool, audio: bool = False) -> None:
    """A vision or audio model's projector (llama.cpp's ``--mmproj``/``-mm``; found beside the model without it)
    and, for ``run``, images (and sound files with ``audio``)."""
    p.add_argument("--mmproj", "-mm", default=None, metavar="FILE",
                   help="the projector (mmproj GGUF: a vision or audio encoder) for the model (default: one beside the model, "
                        "as llama-server's -hf finds it)")
    if audio:
        p.add_argument("--audio", action="append", default=None, metavar="FILE",
                       help="a sound file for an audio model (WAV, MP3, FLAC; at most 10 minutes); repeat for several")
    p.add_argument("--no-mmproj", action="store_true", help="do not load a projector found beside the model (text only)")
    if image:
        p.add_argument("--image", action="append", default=None, metavar="FILE",
                       help="a picture for a vision model (PNG, JPEG, WebP, GIF's first frame); repeat for several")
    else:
        p.set_defaults(image=None)


@dataclass(frozen=True)
class Tools:
    """run and chat: ``--tools``, ``--yes-tools``, ``--max-tool-steps``."""

    tools: str | None
    yes_tools: bool
    max_tool_steps: int

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Tools:
        return cls(tools=ns.tools, yes_tools=ns.yes_tools, max_tool_steps=ns.max_tool_steps)


def add_tools(p: argparse.ArgumentParser) -> None:
    """run and chat: the configured MCP servers' tools (localllm.mcp); read as ``Tools``."""
    g = p.add_argument_group("tools (MCP servers of the config file: localllm mcp list)")
    g.add_argument("--tools", default=None, metavar="NAME[,NAME]|all",
                   help="offer the model these MCP servers' tools; each call is asked for on the terminal")
    g.add_argument("--yes-tools", action="store_true", help="run the model's tool calls without asking")
    g.add_argument("--max-tool-steps", type=int_at_least(1, "--max-tool-steps", 1000), default=10, metavar="N",
                   help="rounds of tool calls in one turn before the loop is stopped (default: 10)")


def add_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("--template", "--chat-template-file", "--chat-template", default=None, metavar="FILE|NAME",
                   help="chat template instead of the model's: a Jinja file, or a llama.cpp built-in name (chatml, llama3, gemma, ...)")

