"""Command implementations, one module each; ``dispatch`` picks one by name."""

from __future__ import annotations

import argparse
import importlib

# Commands whose implementation lives in a package built on the core (the core
# itself never imports them; this lazy import is the only link).
_EXTERNAL = {"quantize": "localllm.quantize.cli", "tui": "localllm.tui.cli", "list": "localllm.commands.list_models"}


def dispatch(args: argparse.Namespace) -> int:
    module = importlib.import_module(_EXTERNAL.get(args.command, f"localllm.commands.{args.command}"))
    return int(module.run(args))
