"""Command implementations, one module each; ``dispatch`` picks one by name."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

# Commands whose implementation lives in a package built on the core (the core
# itself never imports them; this lazy import is the only link).
_EXTERNAL = {"quantize": "localllm.quantize.cli", "tui": "localllm.tui.cli", "list": "localllm.commands.list_models"}

# Every command, in the order ``localllm --help`` lists them; each module declares
# its flags (``register``) and runs the command (``run``).
NAMES = ("tui", "inspect", "run", "chat", "quantize", "doctor", "plan", "completion", "config", "pull", "list", "rm", "add", "serve",
         "ps", "bench", "tune", "mcp", "worker")


def module(name: str) -> ModuleType:
    """The module of the command ``name`` (one of ``NAMES``)."""
    return importlib.import_module(_EXTERNAL.get(name, f"localllm.commands.{name}"))


def dispatch(args: argparse.Namespace) -> int:
    return int(module(args.command).run(args))
