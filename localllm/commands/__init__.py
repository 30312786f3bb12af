"""Command implementations, one module each; ``dispatch`` picks one by name."""

from __future__ import annotations

import argparse
import importlib


def dispatch(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"localllm.commands.{args.command}")
    return int(module.run(args))
