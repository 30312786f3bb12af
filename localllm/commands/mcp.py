"""``localllm mcp``: the MCP servers ``chat --tools`` uses.

``mcp import FILE`` adds the servers of Claude Desktop's, Cursor's or LM
Studio's ``mcpServers`` JSON to the config file (``[mcp.servers.NAME]``);
``mcp list`` starts every configured server (together, each bounded) and
lists its tools with their input schemas, one line per server that fails
(exit 1 when one did).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localllm import paths
from localllm.errors import EXIT_ERROR, UsageError
from localllm.mcp import importer
from localllm.mcp.config import load_settings
from localllm.util import fmt
from localllm.util.fmt import safe


def run(args: argparse.Namespace) -> int:
    if args.mcp_command == "import":
        return _import(args)
    return _list(args)


def _import(args: argparse.Namespace) -> int:
    parsed = importer.read_json(Path(args.file).expanduser())
    target = paths.config_file()
    if not parsed.servers:
        for line in parsed.skipped:
            print(f"localllm: {safe(line)}", file=sys.stderr)
        raise UsageError(f"{args.file}: no MCP server to import")
    added, replaced = importer.add_servers(target, parsed.servers, force=args.force)
    if args.json:
        fmt.print_json({"config": str(target), "added": added, "replaced": replaced, "skipped": list(parsed.skipped)})
        return 0
    for line in parsed.skipped:
        print(f"localllm: {safe(line)}", file=sys.stderr)
    for name in added + replaced:
        s = parsed.servers[name]
        what = f"{s.command} {' '.join(s.args)}".strip() if s.command else s.url
        print(f"{'replaced' if name in replaced else 'added'} {safe(name)}: {safe(what)}")
    print(f"in {safe(target)}; localllm mcp list starts them and lists their tools")
    return 0


def _list(args: argparse.Namespace) -> int:
    from localllm.mcp.hub import Hub  # lazy: asyncio and, once a server starts, the SDK (~1.5 s)

    settings = load_settings()
    if not settings.servers:
        if args.json:
            fmt.print_json({"config": str(settings.source), "servers": []})
            return 0
        print(f"no MCP servers in {safe(settings.source)}: localllm mcp import FILE adds Claude Desktop's or Cursor's")
        return 0
    with Hub.from_settings(settings, args.names or None) as hub:
        failed = hub.start()
        if args.json:
            fmt.print_json({"config": str(settings.source), "servers": [s.to_dict() for s in hub.servers.values()]})
        else:
            for s in hub.servers.values():
                if s.error:
                    continue
                print(f"{safe(s.config.name)} ({s.config.transport}, started in {s.started_ms / 1000:.1f} s): {len(s.tools)} tool(s)")
                for t in s.tools:
                    first = t.description.strip().splitlines()[0] if t.description.strip() else ""
                    print(f"  {safe(t.name)}: {safe(first[:100])}")
                    print(f"    input: {safe(json.dumps(t.schema, ensure_ascii=False)[:300])}")
                for line in s.notices:
                    print(f"  left out: {safe(line)}")
            for s in failed:
                print(f"localllm: MCP server {safe(s.error)}", file=sys.stderr)
    return EXIT_ERROR if failed else 0
