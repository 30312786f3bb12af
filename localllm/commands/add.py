"""``localllm add PATH``: remember a GGUF file, or a folder of them, by name."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.commands._common import say
from localllm.errors import InputError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("add", help="name GGUFs you already have: a file, or a folder of them")
    p.add_argument("path", metavar="PATH", help="a .gguf file or a folder")
    p.add_argument("--json", action="store_true", help="a JSON list of the models it names")


@dataclass(frozen=True)
class Options:
    path: str
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(path=ns.path, json=ns.json)


def run(args: argparse.Namespace) -> int:
    from localllm.modelfile.gguf_file import read_header  # lazy: loads gguf (~0.1 s), which --help (register above) does not need
    from localllm.store import registry  # lazy: the store's registry (hashlib, tempfile: ~12 ms), which --help (register above) does not need

    opts = Options.from_args(args)
    path = Path(opts.path).expanduser()
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
    if opts.json:
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
