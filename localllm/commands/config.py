"""``localllm config``: where the config file is and the flags it sets per command."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("config", help="where the config file is and the defaults it sets, per command")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(subparsers=None)  # every command's parser: cli.main hands them over


@dataclass(frozen=True)
class Options:
    json: bool
    subparsers: dict[str, argparse.ArgumentParser]  # each command's parser (cli.main: the commands sit below the CLI and do not import it)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(json=ns.json, subparsers=dict(ns.subparsers or {}))


def run(args: argparse.Namespace) -> int:
    from localllm.commands import config_file as config  # lazy: the config file's reader (tomllib, tempfile: ~11 ms), which --help does not need

    opts = Options.from_args(args)
    path = config.config_file()
    table = config.load(path)
    subs = opts.subparsers
    flags = {name: config.tokens(table, name, subs, path) for name in subs}
    flags = {name: f for name, f in flags.items() if f}
    if opts.json:
        fmt.print_json({"path": str(path), "exists": path.exists(), "settings": table, "flags": flags})
        return 0
    if not path.exists():
        print(f"{fmt.safe(path)}: not present; defaults are built in (write flag names without dashes, e.g. ctx = 8192, "
              "or a [run] table for one command)")
        return 0
    print(fmt.safe(path))
    for name, f in flags.items():
        print(f"  {name}: {fmt.safe(' '.join(f))}")
    servers = table.get("mcp", {}).get("servers") or {}  # checked by tokens() above
    if servers:
        print(f"  MCP servers (chat --tools, localllm mcp list): {fmt.safe(', '.join(servers))}")
    budget = table.get("sessions", {}).get("kv-budget")  # checked by tokens() above (chat.kept)
    if budget is not None:
        print(f"  saved sessions' KV state budget (list --sessions): {fmt.safe(str(budget))}")
    if not flags and not servers and budget is None:
        print("  (sets nothing)")
    return 0
