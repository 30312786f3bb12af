"""``localllm config``: where the config file is and the flags it sets per command."""

from __future__ import annotations

import argparse

from localllm.commands import config_file as config
from localllm.util import fmt


def run(args: argparse.Namespace) -> int:
    """``args.subparsers``: each command's parser (``cli.main`` hands them over:
    the commands sit below the CLI and do not import it)."""
    path = config.config_file()
    table = config.load(path)
    subs = args.subparsers
    flags = {name: config.tokens(table, name, subs, path) for name in subs}
    flags = {name: f for name, f in flags.items() if f}
    if args.json:
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
    if not flags and not servers:
        print("  (sets nothing)")
    return 0
