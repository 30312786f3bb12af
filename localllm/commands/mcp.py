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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, paths
from localllm.errors import EXIT_ERROR, UsageError
from localllm.util import fmt
from localllm.util.fmt import safe

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("mcp", help="MCP servers for chat --tools: import Claude Desktop's or Cursor's, list their tools")
    msub = p.add_subparsers(dest="mcp_command", metavar="ACTION", parser_class=flags.Parser, required=True)
    m = msub.add_parser("list", help="start each configured server and list its tools with their input schemas")
    m.add_argument("names", nargs="*", metavar="NAME", help="these servers only (default: all)")
    m.add_argument("--json", action="store_true", help="one JSON object")
    m.set_defaults(file=None, force=False)
    m = msub.add_parser("import", help="add the servers of a Claude Desktop / Cursor / LM Studio mcpServers JSON file to the config")
    m.add_argument("file", metavar="FILE", help="e.g. claude_desktop_config.json or ~/.cursor/mcp.json")
    m.add_argument("--force", action="store_true", help="replace servers of the same name")
    m.add_argument("--json", action="store_true", help="one JSON object")
    m.set_defaults(names=None)


@dataclass(frozen=True)
class Options:
    mcp_command: str  # list or import
    names: tuple[str, ...]  # list's
    file: str | None  # import's
    force: bool  # import's
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(mcp_command=ns.mcp_command, names=tuple(ns.names or ()), file=ns.file, force=ns.force, json=ns.json)


def run(args: argparse.Namespace) -> int:
    opts = Options.from_args(args)
    if opts.mcp_command == "import":
        return _import(opts)
    return _list(opts)


def _import(opts: Options) -> int:
    from localllm.mcp import importer  # lazy: the config file's reader and writer (tomllib, tempfile: ~10 ms), which --help does not need

    parsed = importer.read_json(Path(str(opts.file)).expanduser())
    target = paths.config_file()
    if not parsed.servers:
        for line in parsed.skipped:
            print(f"localllm: {safe(line)}", file=sys.stderr)
        raise UsageError(f"{opts.file}: no MCP server to import")
    added, replaced = importer.add_servers(target, parsed.servers, force=opts.force)
    if opts.json:
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


def _list(opts: Options) -> int:
    from localllm.mcp.config import load_settings  # lazy: as importer in _import
    from localllm.mcp.hub import Hub  # lazy: asyncio and, once a server starts, the SDK (~1.5 s)

    settings = load_settings()
    if not settings.servers:
        if opts.json:
            fmt.print_json({"config": str(settings.source), "servers": []})
            return 0
        print(f"no MCP servers in {safe(settings.source)}: localllm mcp import FILE adds Claude Desktop's or Cursor's")
        return 0
    with Hub.from_settings(settings, list(opts.names) or None) as hub:
        failed = hub.start()
        if opts.json:
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
