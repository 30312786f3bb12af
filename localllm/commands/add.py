"""``localllm add PATH``: remember a GGUF file, or a folder of them, by name."""

from __future__ import annotations

import argparse
from pathlib import Path

from localllm.commands._common import say
from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header
from localllm.store import registry
from localllm.util import fmt


def run(args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser()
    if not path.exists():
        raise InputError(f"{path} does not exist")
    if path.is_file():
        read_header(path)  # a file must be a valid GGUF: one line if not
    else:
        for bad in registry.not_ggufs(path):
            say(f"skipped {fmt.safe(bad)}: not a GGUF file (no GGUF magic)")
        if not any(registry.is_gguf(p) for p in path.rglob("*.gguf") if p.is_file()):
            raise InputError(f"{path} holds no GGUF files")
    root = registry.add_path(path)
    named = [e for e in registry.discover() if e.source == "added" and (e.path == root or root in e.path.parents)]
    if args.json:
        fmt.print_json([e.to_dict() for e in named])
        return 0
    for e in named:
        print(f"{fmt.safe(e.name)}\t{fmt.safe(e.path)}")
    if not named:
        say(f"added {root}, but every GGUF in it is known already under another name (see localllm list)")
    else:
        say(f"added {root}: {len(named)} model(s); use the names above with run, chat, plan, ...")
    hidden = registry.hidden_under(root) if root.is_dir() else []
    if hidden:
        say(f"{len(hidden)} model(s) removed with rm stay hidden: localllm add FILE brings one back")
    return 0
