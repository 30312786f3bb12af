"""The ``localllm`` command line: subcommands, one-line errors, meaningful exit codes.

Heavy modules are imported inside the command functions, not here: importing
``llama_cpp`` loads its shared library (~0.18 s measured here), ``gguf`` pulls in
numpy (~0.14 s) and ``textual`` ~0.21 s; ``localllm --help`` needs none of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from localllm import __version__
from localllm.commands import config_file as config
from localllm.commands import dispatch, serve_flags
from localllm.commands.advice import cli_message
from localllm.engine_api.llama_rules import FLASH_ATTN_MODES, KV_CACHE_TYPES
from localllm.engine_api.records import MAX_SEED, SamplingConfig
from localllm.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, LocalLLMError, UsageError
from localllm.plan.workers import parse_endpoints
from localllm.tune.choose import MAX_KL
from localllm.util.fmt import safe
from localllm.util.units import parse_size


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Upper bounds, so that no value reaches llama.cpp's 32-bit fields wrapped or
# one of its asserts: contexts and batches as engine.MAX_CTX (duplicated here so
# that --help does not import llama_cpp), GPU layers as an int32.
MAX_CTX = 1 << 24
MAX_INT32 = 0x7FFFFFFF


def _int_at_least(lo: int, what: str, hi: int | None = None) -> Callable[[str], int]:
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


def _threads(text: str) -> int:
    """At most this machine's logical CPUs (and ggml's GGML_MAX_N_THREADS, 512):
    more threads than CPUs only slows llama.cpp down, and thousands crash it."""
    limit = max(1, min(os.cpu_count() or 1, 512))
    value = _int_at_least(1, "--threads")(text)
    if value > limit:
        raise argparse.ArgumentTypeError(f"--threads must be at most {limit} (this machine's logical CPUs), got {value}")
    return value


def _gen_tokens(text: str) -> int:
    value = _int_at_least(-1, "-n")(text)
    if value == 0:
        raise argparse.ArgumentTypeError("-n must be -1 (until the model stops) or at least 1")
    return value


def _port(text: str) -> int:
    value = _int_at_least(0, "--port")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"--port must be at most 65535, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _float_in(lo: float, hi: float | None, what: str, *, above: bool = False) -> Callable[[str], float]:
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


def _add_sampling(p: argparse.ArgumentParser) -> None:
    """The sampling flags of run, chat and tui, with the one set of defaults
    (``SamplingConfig``'s: llama.cpp's own); ``args.<field>`` is each field's value,
    but for ``--temp`` (``args.temp``) and ``-n`` (``args.n_predict``)."""
    d = SamplingConfig()
    g = p.add_argument_group("sampling (defaults: llama.cpp's)")
    g.add_argument("-n", "--n-predict", "--max-tokens", type=_gen_tokens, default=d.max_tokens, metavar="N",
                   help="most tokens per reply, -1 until the model stops or the context is full (default: -1)")
    g.add_argument("--temp", type=_nonneg_float, default=d.temperature, metavar="T", help=f"temperature, 0 for greedy (default: {d.temperature})")
    g.add_argument("--top-k", type=_int_at_least(0, "--top-k", MAX_INT32), default=d.top_k, metavar="K",
                   help=f"keep the K likeliest tokens, 0 for all (default: {d.top_k})")
    g.add_argument("--top-p", type=_float_in(0, 1, "--top-p"), default=d.top_p, metavar="P",
                   help=f"keep the likeliest tokens up to this total probability, 1 for all (default: {d.top_p})")
    g.add_argument("--min-p", type=_float_in(0, 1, "--min-p"), default=d.min_p, metavar="P",
                   help=f"drop tokens below P times the likeliest one's probability, 0 for none (default: {d.min_p})")
    g.add_argument("--repeat-penalty", type=_float_in(0, None, "--repeat-penalty", above=True), default=d.repeat_penalty, metavar="R",
                   help=f"make tokens seen in the last 64 less likely by a factor R, 1 for off (default: {d.repeat_penalty})")
    g.add_argument("--seed", "-s", type=_int_at_least(0, "--seed", MAX_SEED), default=d.seed, metavar="N", help="sampling seed (default: random)")


def _int_list(text: str) -> list[int]:
    parse = _int_at_least(1, "each value", MAX_CTX)
    values = [parse(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one value, e.g. 128,512")
    return values


def _add_model(p: argparse.ArgumentParser, *, long_flag: bool = True, default: str = "smollm2") -> None:
    p.add_argument("model", nargs="?", default=None,
        help="a name from localllm list (smollm2, gemma3-270m, llama-3.2-1b-instruct:q4_k_m, ...) or a path to a "
        f".gguf file; default: {default}")
    p.add_argument(*(("-m", "--model") if long_flag else ("-m",)), dest="model_flag", default=None, metavar="MODEL",
                   help="the model, as llama.cpp's -m")


def _add_pull_options(p: argparse.ArgumentParser) -> None:
    """run, chat, tui, serve: a Hub name that is not downloaded is pulled first."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--yes", "-y", action="store_true", help="pull a model that is not downloaded without asking")
    g.add_argument("--no-pull", action="store_true", help="never download: a model that is not here is an error")


def _add_vision(p: argparse.ArgumentParser, *, image: bool) -> None:
    """A vision model's projector (llama.cpp's ``--mmproj``/``-mm``; found beside the model without it) and, for ``run``, images."""
    p.add_argument("--mmproj", "-mm", default=None, metavar="FILE",
                   help="the vision projector (mmproj GGUF) for the model (default: one beside the model, as llama-server's -hf finds it)")
    p.add_argument("--no-mmproj", action="store_true", help="do not load a projector found beside the model (text only)")
    if image:
        p.add_argument("--image", action="append", default=None, metavar="FILE",
                       help="a picture for a vision model (PNG, JPEG, WebP, GIF's first frame); repeat for several")


def _add_tools(p: argparse.ArgumentParser) -> None:
    """run and chat: the configured MCP servers' tools (localllm.mcp)."""
    g = p.add_argument_group("tools (MCP servers of the config file: localllm mcp list)")
    g.add_argument("--tools", default=None, metavar="NAME[,NAME]|all",
                   help="offer the model these MCP servers' tools; each call is asked for on the terminal")
    g.add_argument("--yes-tools", action="store_true", help="run the model's tool calls without asking")
    g.add_argument("--max-tool-steps", type=_int_at_least(1, "--max-tool-steps", 1000), default=10, metavar="N",
                   help="rounds of tool calls in one turn before the loop is stopped (default: 10)")


def _add_template(p: argparse.ArgumentParser) -> None:
    p.add_argument("--template", "--chat-template-file", "--chat-template", default=None, metavar="FILE|NAME",
                   help="chat template instead of the model's: a Jinja file, or a llama.cpp built-in name (chatml, llama3, gemma, ...)")


class _Typed(argparse.Action):
    """Stores the value and notes that the user typed the option (``args.ctx_typed``),
    so a warning about the value is given for the user's choice, not a default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_typed", True)


# what a --ctx left out asks for (plan.fitting.default_ctx decides it, and fits it: it may shrink)
RUN_CTX = "the model's trained context, at most 4096"
SERVE_CTX = "the model's trained context, or the largest that fits with --parallel of them"
BENCH_CTX = "what the longest prompt and its reply need"
TUI_CTX = "4096, or the cockpit's setting"


def _add_load_options(p: argparse.ArgumentParser, *, fit: bool = True, rpc: bool = True,
                      ctx_help: str = f"context size in tokens (default: {RUN_CTX})") -> None:
    g = p.add_argument_group("load options")
    # no default: None lets the plan decide (plan.fitting.default_ctx), the one place the default context is chosen
    g.add_argument("--ctx", "-c", "--ctx-size", type=_int_at_least(1, "--ctx", MAX_CTX), default=None, metavar="N", action=_Typed,
                   help=ctx_help)
    g.add_argument("--threads", "-t", type=_threads, default=None, metavar="N",
                   help="CPU threads, fixed (default: chosen as it decodes, starting from the fast physical cores)")
    g.add_argument("--ngl", "-ngl", "--n-gpu-layers", "--gpu-layers", type=_int_at_least(-1, "--ngl", MAX_INT32), default=None, metavar="N",
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
    moe.add_argument("--n-cpu-moe", "-ncmoe", type=_int_at_least(0, "--n-cpu-moe", MAX_INT32), dest="n_cpu_moe", metavar="N",
                     help="keep the expert weights of the first N layers in RAM (as llama.cpp's --n-cpu-moe; default: none, "
                     "or as many as a mixture of experts needs to fit --vram)")
    g.add_argument("--batch", "-b", "--batch-size", type=_int_at_least(1, "--batch", MAX_CTX), default=512, metavar="N",
                   help="logical batch for prompt processing (default: 512)")
    g.add_argument("--ubatch", "-ub", "--ubatch-size", type=_int_at_least(1, "--ubatch", MAX_CTX), default=512, metavar="N",
        help="physical batch: sizes the compute buffer (default: 512)")
    if rpc:
        g.add_argument("--rpc", type=_rpc, default=None, metavar="HOST:PORT[,...]",
            help="also use the devices of these workers (localllm worker on each machine); no authentication: trusted "
            "networks only")
    if fit:
        g.add_argument("--vram", type=_size, default=None, metavar="SIZE",
            help="GPU memory budget: 4GiB (4·2³⁰ bytes), 6GB (6·10⁹), 512MiB; a bare number is GiB (default: detected)")
        g.add_argument("--policy", choices=("ctx", "offload"), default="ctx",
            help="when it does not fit: shrink the context first (ctx, default) or offload fewer layers (offload)")
        g.add_argument("--no-dry-run", action="store_true",
            help="skip llama.cpp's dry run of the load, the referee for compute and output buffers where the graph replay "
            "does not cover the model (about 0.4 s)")


class _Lora(argparse.Action):
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


def _add_lora(p: argparse.ArgumentParser) -> None:
    """LoRA adapters, with llama-server's spellings (run, chat, serve, plan, the cockpit)."""
    g = p.add_argument_group("LoRA adapters (llama-server's flags)")
    g.add_argument("--lora", action=_Lora, dest="lora", default=None, metavar="FNAME[,FNAME]",
                   help="a LoRA adapter GGUF to apply at scale 1 (repeatable; commas for several)")
    g.add_argument("--lora-scaled", action=_Lora, dest="lora", metavar="FNAME:SCALE[,...]",
                   help="a LoRA adapter GGUF with its scale (repeatable; commas for several)")
    g.add_argument("--lora-init-without-apply", action="store_true",
                   help="load the adapters at scale 0 (serve: set them later with POST /lora-adapters or a request's lora)")


def _rpc(text: str):

    try:
        return parse_endpoints(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    """A ``units.Size``: bytes that remember the unit typed, to be shown in it."""

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="localllm", description="Run, measure and shrink LLMs on your own laptop, offline.")
    parser.add_argument("--version", action="version", version=f"localllm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log on stderr")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("tui", help="the cockpit: chat with live TTFT, ITL, memory budget and KV cache (also: bare localllm)")
    _add_model(p)
    _add_pull_options(p)
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help="system prompt (default: a helpful assistant)")
    _add_sampling(p)
    _add_load_options(p, ctx_help=f"context size in tokens (default: {TUI_CTX})")
    _add_lora(p)
    _add_vision(p, image=False)  # a vision model: pictures attached on screen (Ctrl+F, or a path pasted)
    p.add_argument("--tools", default=None, metavar="NAME[,NAME]|all",
                   help="offer the model these MCP servers' tools (the config file's [mcp.servers]); each call is approved on screen")

    p = sub.add_parser("inspect", help="what a GGUF model is, from its header (no load)")
    _add_model(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")

    p = sub.add_parser(
        "run", help="generate a reply and show TTFT, ITL and throughput",
        description="TTFT runs from the prompt's submission (after the model load) to the first token that prints text: "
        "template, tokenizing, prefill and sampling included; the prefill time is shown on its own.",
    )
    _add_model(p)
    _add_pull_options(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt (default: read stdin)")
    p.add_argument("--file", action="append", default=None, metavar="PATH",
                   help="a text file (code, Markdown, logs, CSV, JSON) or a PDF read into the prompt, in a block with its name; repeat for several")
    _add_sampling(p)
    p.add_argument("--raw", action="store_true", help="complete the prompt as-is, without the chat template")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-generation token (as llama.cpp's --ignore-eos; with -n N)")
    _add_template(p)
    p.add_argument("--no-stats", action="store_true", help="do not print the stats block")
    p.add_argument("--speculate", choices=("lookup", "draft"), default=None, help="speculative decoding (greedy, --temp 0): prompt lookup, or a --draft model")
    p.add_argument("--draft", default=None, metavar="MODEL", help="the draft model for --speculate draft (same vocabulary)")
    p.add_argument("--draft-k", type=_int_at_least(1, "--draft-k", 64), default=8, metavar="N", help="tokens drafted per step (default: 8)")
    _add_load_options(p)
    _add_lora(p)
    p.add_argument("--json", action="store_true", help="one JSON object with the text and the stats")
    _add_vision(p, image=True)
    _add_tools(p)

    p = sub.add_parser("chat", help="a line-by-line chat in the terminal (no TUI); the context shifts instead of filling up")
    _add_model(p)
    _add_pull_options(p)
    p.add_argument("--system", "-sys", "--system-prompt", default=None, help="system prompt (always kept when the context shifts)")
    _add_sampling(p)
    p.add_argument("--no-stats", action="store_true", help="no summary line after each reply")
    p.add_argument("--no-prompt-cache", action="store_true", help="do not save or load the system prompt's KV state")
    _add_template(p)
    _add_load_options(p)
    _add_lora(p)
    p.add_argument("--json", action="store_true", help="one JSON line per turn")
    _add_vision(p, image=False)
    _add_tools(p)

    p = sub.add_parser("quantize", help="make Q8_0/Q4_K_M/... GGUFs from F16/BF16/F32 and report what quality it cost")
    p.add_argument("paths", nargs="*", metavar="INPUT [OUTPUT]",
        help="the source GGUF or a model name, and the output (default: <base>-<TYPE>.gguf beside a path, in localllm's models folder for a name)")
    p.add_argument("--type", default=None, metavar="TYPE", help="Q8_0, Q6_K, Q5_K_M, Q5_0, Q4_K_M, Q4_K_S, Q4_0, IQ4_NL, F16, BF16, ...")
    p.add_argument("--imatrix", default=None, metavar="FILE", help="importance matrix (llama-imatrix GGUF) to guide the rounding")
    p.add_argument("--threads", type=_threads, default=None, metavar="N", help="threads (default: all)")
    p.add_argument("--allow-requantize", action="store_true", help="quantize an already quantized file (loses more quality)")
    p.add_argument("--dry-run", action="store_true", help="print the output size, write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--eval", action="store_true", help="measure perplexity, KL divergence and top-1 agreement against the source")
    p.add_argument("--eval-tokens", type=_int_at_least(256, "--eval-tokens"), default=None, metavar="N", help="score only the first N tokens of the text")
    p.add_argument("--compare", nargs="+", default=None, metavar="FILE", help="SOURCE Q1 Q2 ...: quality of several files side by side")
    p.add_argument("--json", action="store_true", help="one JSON object (a list with --compare)")

    p = sub.add_parser("doctor", help="why is it slow? measure TTFT, ITL and the roofline, name the bottleneck, rank fixes")
    _add_model(p)
    p.add_argument("--prompt-file", default=None, metavar="F", help="a prompt like yours (default: a page of text and a question)")
    p.add_argument("--gen-tokens", type=_int_at_least(2, "--gen-tokens"), default=64, metavar="N", help="tokens to generate (default: 64)")
    p.add_argument("--no-quality", action="store_true", help="skip measuring what a q8_0 KV cache costs")
    _add_load_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("plan", help="memory per device: weights, KV cache, compute; what fits a GPU budget")
    _add_model(p)
    _add_load_options(p, ctx_help=f"context size in tokens, as run loads it (default: {RUN_CTX}; serve's is shown too)")
    _add_lora(p)
    _add_vision(p, image=False)
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("completion", help="a shell completion script (bash, zsh, fish), model names included")
    p.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"), default=None, help="the shell")
    p.add_argument("--names", action="store_true", help="print the model names a model argument takes, one per line")

    p = sub.add_parser("config", help="where the config file is and the defaults it sets, per command")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("pull", help="download a GGUF from Hugging Face into its cache (resumable, checksum verified)")
    p.add_argument("repo", metavar="REPO[:QUANT]",
        help="owner/name on the Hub, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M, or a catalog name (list --catalog)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--file", default=None, metavar="NAME", help="the file in the repo")
    which.add_argument("--quant", default=None, metavar="Q", help="the quant to take, e.g. Q4_K_M or Q8_0")
    p.add_argument("--vram", type=_size, default=None, metavar="SIZE",
        help="with no --file/--quant: the largest quant that fits this GPU budget, by the planner")
    p.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default: main)")
    p.add_argument("--offline", action="store_true", help="use the cache only; never touch the network (also: HF_HUB_OFFLINE=1)")
    p.add_argument("--no-dry-run", action="store_true",
        help="with --vram: judge each quant by the rules alone, without llama.cpp's dry run of its header")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("list", help="models here: pulled, Hugging Face cache, LM Studio, Ollama, added; and whether each fits")
    p.add_argument("--catalog", action="store_true", help="the curated list of models for 4-6 GiB GPUs, with the planner's verdicts")
    p.add_argument("--vram", type=_size, default=None, metavar="SIZE", help="judge fit against this GPU budget (default: detected)")
    p.add_argument("--json", action="store_true", help="a JSON list")

    p = sub.add_parser("rm", help="delete a model localllm stored (asks first); says who owns the others")
    p.add_argument("name", metavar="NAME", help="a name from localllm list (that model only), or a folder given to add (all of it)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("add", help="name GGUFs you already have: a file, or a folder of them")
    p.add_argument("path", metavar="PATH", help="a .gguf file or a folder")
    p.add_argument("--json", action="store_true", help="a JSON list of the models it names")

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (loopback by default)",
                       description="serve MODEL serves one model; with no MODEL, every model of localllm list by name, each loaded "
                       "on demand in a process of its own and unloaded when idle (as Ollama and llama-server's router do).")
    _add_model(p, default="every model of localllm list, by name, loaded on demand")
    _add_pull_options(p)
    p.add_argument("--host", action="append", default=None, metavar="HOST[,HOST]",
        help="address(es) to listen on, repeatable or comma-separated (default: 127.0.0.1; another one warns without --api-key)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port, 0 for any free one (default: 8080)")
    p.add_argument("--parallel", "-np", type=_int_at_least(1, "--parallel"), default=serve_flags.DEFAULT_PARALLEL, metavar="N",
        help=f"sequences decoded together; the KV cache holds N x --ctx (default: {serve_flags.DEFAULT_PARALLEL})")
    p.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY' (also: LOCALLLM_API_KEY)")
    p.add_argument("--alias", default=None, metavar="NAME", help="the model's name in the API (default: the name given)")
    p.add_argument("-to", "--timeout", type=_float_in(0, 3600, "--timeout", above=True), default=None, metavar="S",
        help="seconds a client has to send a request's head before a 408 closes the connection (default: 10, a bound on "
             "half-sent requests; the whole request gets at least 60) (llama-server's name)")
    p.add_argument("--max-queue", type=_int_at_least(1, "--max-queue"), default=64, metavar="N", help="requests waiting for a slot before 429 (default: 64)")
    p.add_argument("--prefill-chunk", type=_int_at_least(1, "--prefill-chunk"), default=128, metavar="N",
        help="prompt tokens per step while others generate (default: 128)")
    p.add_argument("--cache-ram", type=_int_at_least(-1, "--cache-ram", 2**40), default=8192, metavar="MIB",
        help="idle requests' prompts kept in RAM, out of the KV cache, up to MIB and the KV pool's tokens "
             "(llama-server's flag; -1: no byte limit, 0: off, idle prompts stay in the KV cache; default: 8192)")
    p.add_argument("--embeddings", action="store_true",
        help="make /v1/embeddings' context at start, not at the first request (llama-server's flag; embeddings are always served beside chat)")
    p.add_argument("--pooling", choices=("mean", "last", "cls", "rank"), default=None,
        help="how /v1/embeddings pools a sequence (default: what the model declares, else mean); rank: as --rerank")
    p.add_argument("--rerank", "--reranking", action="store_true",
        help="serve /v1/rerank with the model's classification head (llama-server's flag: rank pooling; a reranker GGUF is needed)")
    _add_load_options(p, ctx_help=f"each request's context in tokens; the KV cache holds --parallel of them (default: {SERVE_CTX})")
    _add_lora(p)
    _add_vision(p, image=False)  # requests' images (serve/media.py)
    _add_sampling(p)  # the defaults of a request's omitted fields, as llama-server's --temp, --seed, -n ...
    _add_template(p)
    serve_flags.add(p)
    p.add_argument("--json", action="store_true", help="the request log as one JSON object per line (stderr)")
    r = p.add_argument_group("router (serve with no MODEL)")
    r.add_argument("--models", default=None, metavar="all|NAME[,NAME]",
        help="serve these models of localllm list by name, each loaded on demand (default with no MODEL: all)")
    r.add_argument("--models-max", type=_int_at_least(0, "--models-max"), default=4, metavar="N",
        help="models loaded at once; the least recently used idle one is unloaded to load another (llama-server's flag; 0: no cap; default: 4)")
    idle = r.add_mutually_exclusive_group()
    idle.add_argument("--keep-alive", default=None, metavar="DURATION",
        help="how long an idle model stays loaded: 30s, 5m, 1h, seconds; -1 for ever, 0 unload after each request "
             "(Ollama's; a request's keep_alive wins; also OLLAMA_KEEP_ALIVE; default: 5m)")
    idle.add_argument("--sleep-idle-seconds", type=_int_at_least(-1, "--sleep-idle-seconds"), default=None, metavar="N",
        help="llama-server's name for --keep-alive, in seconds (-1: for ever)")
    r.add_argument("--models-preset", default=None, metavar="FILE",
        help="a llama-server presets INI: [*] for every model, [NAME] for one (llama-server's option names, "
             "load-on-startup = true loads it at start); what is typed wins, then the model's section, then [*], then the config file")
    r.add_argument("--models-autoload", action=argparse.BooleanOptionalAction, default=True,
        help="load a model when a request names it (llama-server's flag; with --no-models-autoload only POST /models/load does, "
             "and a request for a model not loaded is a 400; default: on)")
    r.add_argument("--default-model", default=None, metavar="NAME", help=argparse.SUPPRESS)  # the config file's model: loaded at start and kept

    p = sub.add_parser("ps", help="the models a running server (localllm serve, Ollama) has loaded: memory, CPU/GPU split, until when")
    p.add_argument("--url", default="http://127.0.0.1:8080", metavar="URL", help="the server (default: http://127.0.0.1:8080, serve's)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="the server's key, sent as 'Authorization: Bearer KEY' (also: LOCALLLM_API_KEY)")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("bench", help="prefill and decode throughput (llama-bench style); --url measures an OpenAI-compatible server")
    _add_model(p, long_flag=False)  # --model names the served model with --url
    p.add_argument("--prompt-tokens", type=_int_list, default=None, metavar="N,N", help="prompt lengths (default: 128,512,2048; 128 with --url)")
    p.add_argument("--gen-tokens", type=_int_at_least(1, "--gen-tokens"), default=128, metavar="N", help="tokens to generate per run (default: 128)")
    p.add_argument("--reps", type=_int_at_least(1, "--reps"), default=3, metavar="N", help="repetitions per prompt length (default: 3)")
    _add_vision(p, image=True)  # --image: the vision encoder timed too (a vision model's TTFT has a third phase)
    _add_load_options(p, fit=False, ctx_help=f"context size in tokens (default: {BENCH_CTX})")
    u = p.add_argument_group("server options (--url)")
    u.add_argument("--url", default=None, metavar="URL", help="measure this OpenAI-compatible server instead, e.g. http://127.0.0.1:8080/v1")
    u.add_argument("--model", dest="served_model", default=None, metavar="NAME", help="model name to ask for (default: the server's first in /v1/models)")
    u.add_argument("--concurrency", type=_int_list, default=[1, 4, 8], metavar="N,N", help="concurrent streaming clients (default: 1,4,8)")
    u.add_argument("--requests", type=_int_at_least(1, "--requests"), default=None, metavar="N",
        help="requests per concurrency level (default: 2 x concurrency, at least 4)")
    u.add_argument("--api-key", default=None, metavar="KEY", help="sent as 'Authorization: Bearer KEY' (also: OPENAI_API_KEY)")
    u.add_argument("--timeout", type=_nonneg_float, default=300.0, metavar="S", help="seconds per request (default: 300)")
    p.add_argument("--json", action="store_true", help="a JSON list of rows")

    p = sub.add_parser("tune", help="measure ubatch, flash attention, KV cache type and threads on this machine; keep the fastest in the config file",
        description="Each setting is measured on prefill and decode, alternated with the others, at the context you run; the "
        "fastest the memory plan allows goes into the model's [models.\"NAME\"] table of the config file, where run, chat, "
        "serve and the cockpit read it (a flag typed still wins; localllm plan shows what came from tune). Ctrl+C keeps "
        "what was measured.")
    _add_model(p)
    p.add_argument("--ctx", "-c", "--ctx-size", type=_int_at_least(1, "--ctx", MAX_CTX), default=None, metavar="N",
                   help="the context to tune at (default: the one run uses: the model's, at most 4096)")
    p.add_argument("--threads", "-t", type=_threads, default=None, metavar="N", help="fix the thread count: it is then not tuned")
    p.add_argument("--vram", type=_size, default=None, metavar="SIZE", help="GPU memory budget for the plan (default: detected)")
    p.add_argument("--quick", action="store_true", help="a short run: few tokens, two candidates a setting (the test suite's)")
    p.add_argument("--force", action="store_true", help="measure even when another program keeps the CPU busy (the figures will be off)")
    p.add_argument("--max-kl", type=_float_in(0.0, None, "--max-kl", above=True), default=MAX_KL, metavar="X",
                   help="the most mean KL divergence against an f16 cache a quantized KV cache may cost to be chosen (default: %(default)s)")
    p.add_argument("--no-write", action="store_true", help="measure and show; leave the config file as it is")
    p.add_argument("--json", action="store_true", help="one JSON object: every figure, null where not measured")

    p = sub.add_parser("mcp", help="MCP servers for chat --tools: import Claude Desktop's or Cursor's, list their tools")
    msub = p.add_subparsers(dest="mcp_command", metavar="ACTION", parser_class=_Parser, required=True)
    m = msub.add_parser("list", help="start each configured server and list its tools with their input schemas")
    m.add_argument("names", nargs="*", metavar="NAME", help="these servers only (default: all)")
    m.add_argument("--json", action="store_true", help="one JSON object")
    m = msub.add_parser("import", help="add the servers of a Claude Desktop / Cursor / LM Studio mcpServers JSON file to the config")
    m.add_argument("file", metavar="FILE", help="e.g. claude_desktop_config.json or ~/.cursor/mcp.json")
    m.add_argument("--force", action="store_true", help="replace servers of the same name")
    m.add_argument("--json", action="store_true", help="one JSON object")

    p = sub.add_parser("worker", help="serve this machine's devices to another machine's --rpc (llama.cpp's RPC server)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="IPv4 address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_worker_port, default=50052, metavar="N", help="TCP port (default: 50052)")
    p.add_argument("--threads", type=_int_at_least(1, "--threads"), default=None, metavar="N", help="CPU threads for a CPU device (default: physical cores)")
    p.add_argument("--device", type=lambda t: [d for d in t.split(",") if d], default=None, metavar="DEV[,DEV]",
        help="devices to serve, e.g. CUDA0 or CPU (default: the GPUs, else the CPU)")
    p.add_argument("--i-understand-this-is-open", action="store_true",

                       help="allow a --host other than loopback: the RPC protocol has no authentication, anyone who reaches the "
                       "port can use this machine's devices and memory")
    p.add_argument("--json", action="store_true", help="one JSON line on stdout when the worker is ready (endpoint, devices)")
    return parser


def _worker_port(text: str) -> int:
    """A worker's port: llama.cpp's RPC server needs a fixed one (clients name it)."""
    value = _int_at_least(1, "--port")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"--port must be at most 65535, got {value}")
    return value


def _setup_logging(verbose: bool) -> None:
    llama_log = logging.getLogger("localllm.llama")
    llama_log.propagate = False
    llama_log.handlers[:] = [logging.StreamHandler(sys.stderr) if verbose else logging.NullHandler()]
    llama_log.setLevel(logging.DEBUG if verbose else logging.WARNING)
    # huggingface_hub logs retries and warnings to stderr through its own handler,
    # configured from HF_HUB_VERBOSITY when it is first imported: errors reach the
    # user as our one line instead (unless -v, or the user chose a verbosity).
    if not verbose:
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")


def _tolerant_stdin() -> None:
    """Invalid UTF-8 on stdin becomes U+FFFD instead of ending the command."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="replace")
        except (ValueError, OSError):  # a closed or detached stdin
            pass


TOP_LEVEL = ("-h", "--help", "--version", "-v", "--verbose", "--debug")


def cockpit_by_default(argv: Sequence[str]) -> list[str]:
    """``localllm --threads 1`` (options, no command) opens the cockpit with them,
    as bare ``localllm`` does: ``tui`` goes after the top-level options."""
    argv = list(argv)
    i = 0
    while i < len(argv) and argv[i] in TOP_LEVEL:
        i += 1
    if i < len(argv) and argv[i].startswith("-") and not any(a in ("-h", "--help", "--version") for a in argv[:i]):
        return [*argv[:i], "tui", *argv[i:]]
    return argv


def _model_flag(args: argparse.Namespace) -> None:
    """``-m MODEL`` (llama.cpp's spelling) and the positional MODEL are one."""
    flag = getattr(args, "model_flag", None)
    if flag is None:
        return
    if getattr(args, "model", None) is not None:
        raise UsageError(f"two models given ({args.model} and -m {flag}): give one")
    args.model = flag


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to its subparsers
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def with_config(parser: argparse.ArgumentParser, argv: list[str], command: str) -> list[str]:
    """``argv`` with the config file's flags for ``command`` put right after the
    command's name, so that the flags typed after them win."""
    path = config.config_file()
    table = config.load(path)
    model = _model_named(parser, argv) if config.MODELS in table else None
    flags = config.tokens(table, command, subparsers(parser), path, model=model)
    if command == "serve":  # the config's default model is the router's to load at start and keep; serve MODEL is typed
        flags = ["--default-model" if f == "--model" else f for f in flags]
    if not flags:
        return argv
    i = argv.index(command) if command in argv else len(argv)
    return [*argv[: i + 1], *flags, *argv[i + 1 :]] if command in argv else [command, *flags]


def _model_named(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The model ``argv`` loads, for its ``[models."NAME"]`` table: -m, else the
    positional, else the default model of a command that loads one (not serve's
    router, whose models each get their own table)."""
    args = parser.parse_args(argv)
    if not hasattr(args, "model"):
        return None
    named = getattr(args, "model_flag", None) or args.model
    if named is None and args.command != "serve":
        from localllm.store.builtin import DEFAULT_MODEL  # lazy: the store, only when a config file names models

        return DEFAULT_MODEL
    return named


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.command is None:
        return args
    final = parser.parse_args(with_config(parser, argv, args.command))
    if args.command in ("serve", "tune"):  # the router applies each model's table under what was typed (commands/serve_models.py);
        # tune tunes what the file set and leaves what was typed
        final.typed_argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, cockpit_by_default(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:  # the config file
        print(f"localllm: error: {safe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    _setup_logging(args.verbose)
    _tolerant_stdin()
    if args.command is None:
        # Bare ``localllm`` opens the cockpit on the default model, as a terminal allows.
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            parser.print_help()
            return 0
        try:
            args = _parse(parser, ["tui"])
        except UsageError as exc:
            print(f"localllm: error: {safe(exc)}", file=sys.stderr)
            return EXIT_USAGE

    if args.command in ("config", "completion", "serve", "tune"):  # serve: its router passes its options on to each model's process
        args.subparsers = subparsers(parser)
    try:
        _model_flag(args)
        return dispatch(args)
    except LocalLLMError as exc:
        print(f"localllm: error: {safe(cli_message(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("localllm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as exc:  # a bug: still one line, unless --debug
        if args.debug:
            raise

        print(f"localllm: internal error: {type(exc).__name__}: {safe(exc)} (rerun with --debug for details)", file=sys.stderr)
        return EXIT_ERROR
