"""The ``localllm`` command line: subcommands, one-line errors, meaningful exit codes.

Each command declares its flags in its own module (``register``), which this
module imports to build the parser; heavy modules are imported inside the
command functions, not at the top of any of them: importing
``llama_cpp`` loads its shared library (~0.18 s measured here), ``gguf`` pulls in
numpy (~0.14 s) and ``textual`` ~0.21 s; ``localllm --help`` needs none of them.

A command typed by name gets a parser of that command alone, as git reads only the
builtin it runs: importing all 19 command modules and declaring their flags took
19 ms of every start (``localllm.cli`` imported in 78 ms against 60 ms before the
commands owned their flags), paid by each ``serve``, ``run`` and router child.
``--help``, a name that is no command, ``config`` and ``completion`` (which list
every command's flags), and a config file (checked against every command's flags)
get them all.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from localllm import __version__, commands
from localllm.commands import dispatch
from localllm.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, LocalLLMError, UsageError
from localllm.flags import Parser
from localllm.util.fmt import safe

EVERY = ("config", "completion")  # commands that read every command's parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``commands.NAMES``, each module light at import: its
    heavy imports are inside its functions, see above), or of the command ``only`` alone."""
    parser = Parser(prog="localllm", description="Run, measure and shrink LLMs on your own laptop, offline.")
    parser.add_argument("--version", action="version", version=f"localllm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log on stderr")
    parser.add_argument("--debug", action="store_true", help="show a traceback on internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in (only,) if only in commands.NAMES else commands.NAMES:
        commands.module(name).register(sub)
    return parser


def command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names after the top-level options, if a parser of it alone will
    do (``build_parser``'s docstring above); None: every command's parser."""
    i = 0
    while i < len(argv) and argv[i] in TOP_LEVEL:
        if argv[i] in ANSWERED:
            return None
        i += 1
    name = argv[i] if i < len(argv) else None
    return name if name in commands.NAMES and name not in EVERY else None


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


ANSWERED = ("-h", "--help", "--version")  # top-level options argparse answers itself, with every command listed
TOP_LEVEL = (*ANSWERED, "-v", "--verbose", "--debug")


def cockpit_by_default(argv: Sequence[str]) -> list[str]:
    """``localllm --threads 1`` (options, no command) opens the cockpit with them,
    as bare ``localllm`` does: ``tui`` goes after the top-level options."""
    argv = list(argv)
    i = 0
    while i < len(argv) and argv[i] in TOP_LEVEL:
        i += 1
    if i < len(argv) and argv[i].startswith("-") and not any(a in ANSWERED for a in argv[:i]):
        return [*argv[:i], "tui", *argv[i:]]
    return argv


def _model_flag(args: argparse.Namespace) -> None:
    """``-m MODEL`` (llama.cpp's spelling) and the positional MODEL are one."""
    if not hasattr(args, "model_flag"):  # a command with no model (flags.add_model declares both)
        return
    flag = args.model_flag
    if flag is None:
        return
    if args.model is not None:
        raise UsageError(f"two models given ({args.model} and -m {flag}): give one")
    args.model = flag


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to its subparsers
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def with_config(parser: argparse.ArgumentParser, argv: list[str], command: str,
                every: Callable[[], argparse.ArgumentParser] | None = None) -> list[str]:
    """``argv`` with the config file's flags for ``command`` put right after the
    command's name, so that the flags typed after them win. The file is checked
    against every command's flags: ``every()`` gives their parser where ``parser``
    has one command's alone (None: ``parser`` has them all)."""
    from localllm.commands import config_file as config  # lazy: the config file's reader (tomllib, tempfile: ~11 ms), which --help does not need

    path = config.config_file()
    table = config.load(path)
    if not table:
        return argv
    model = _model_named(parser, argv) if config.MODELS in table else None
    flags = config.tokens(table, command, subparsers(every() if every is not None else parser), path, model=model)
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
    named = args.model_flag or args.model
    if named is None and args.command != "serve":
        from localllm.store.builtin import DEFAULT_MODEL  # lazy: the store, only when a config file names models

        return DEFAULT_MODEL
    return named


def _parse(parser: argparse.ArgumentParser, argv: list[str], every: Callable[[], argparse.ArgumentParser] | None = None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.command is None:
        return args
    final = parser.parse_args(with_config(parser, argv, args.command, every))
    if args.command in ("serve", "tune"):  # the router applies each model's table under what was typed (commands/serve_models.py);
        # tune tunes what the file set and leaves what was typed
        final.typed_argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    return final


def main(argv: Sequence[str] | None = None) -> int:
    argv = cockpit_by_default(sys.argv[1:] if argv is None else argv)
    only = command_named(argv)
    parser = build_parser(only)
    every = build_parser if only is not None else None
    try:
        args = _parse(parser, argv, every)
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
        from localllm.commands.advice import cli_message  # lazy: the advice on an engine error, only when one is raised

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
