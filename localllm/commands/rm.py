"""``localllm rm NAME``: delete a model localllm stored; for anyone else's, say whose.

localllm stored: files it pulled (in the Hugging Face cache: the snapshot link and,
when nothing else links to it, the blob), GGUFs in its own models folder, and the
paths ``add`` remembered (only the memory goes, never the file). Files of the Hugging
Face cache that other tools downloaded, LM Studio's, Ollama's and the pip-shipped
default model are not touched: the error names the tool's own way to remove them.
What may be deleted and how is ``store.removal``'s (the router's ``/api/delete``
asks the same); this adds the question, ``rm FOLDER`` and what is printed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.commands._common import say
from localllm.errors import InputError
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("rm", help="delete a model localllm stored (asks first); says who owns the others")
    p.add_argument("name", metavar="NAME", help="a name from localllm list (that model only), or a folder given to add (all of it)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    p.add_argument("--json", action="store_true", help="one JSON object")


@dataclass(frozen=True)
class Options:
    name: str
    yes: bool
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(name=ns.name, yes=ns.yes, json=ns.json)


def run(args: argparse.Namespace) -> int:
    from localllm.store import registry, removal  # lazy: the store's registry (hashlib, tempfile: ~12 ms), which --help (register above) does not need

    opts = Options.from_args(args)
    folder = _added_folder(opts.name)
    if folder is not None:
        return _forget_folder(folder, opts)
    entry = registry.find(opts.name)
    if entry is None:
        raise InputError(f"no model named '{opts.name}' (see localllm list)")
    refused = removal.refusal(entry)
    if refused is not None:
        raise InputError(refused)
    action = removal.action(entry)
    size = entry.path.stat().st_size if entry.path.exists() else 0
    what = f"{action} {entry.name} ({fmt.size(size)}, {entry.path})"
    if not opts.yes and not _confirm(what):
        say("nothing deleted (answer y, or pass --yes)")
        return 1
    deleted = removal.remove(entry).deleted
    if opts.json:
        fmt.print_json({"name": entry.name, "source": entry.source, "action": action, "deleted": deleted, "path": str(entry.path)})
    elif entry.source == "added":
        say(f"forgot {entry.name} ({entry.path}; the file stays: localllm did not store it; localllm add {entry.path} brings it back)")
    else:
        say(f"deleted {entry.name}: " + ", ".join(deleted))
    return 0


def _added_folder(name: str) -> Path | None:
    """``rm FOLDER``: the added folder ``name`` is, or None."""
    from localllm.store import registry  # lazy: as in run

    p = Path(name).expanduser()
    if not p.is_dir():
        return None
    root = p.resolve()
    return root if str(root) in registry.load_record().added else None


def _forget_folder(root: Path, opts: Options) -> int:
    """Forget an added folder and every model in it (the files stay)."""
    from localllm.store import registry  # lazy: as in run

    named = [e for e in registry.discover() if e.source == "added" and root in e.path.parents]
    if not opts.yes and not _confirm(f"forget the folder {root} ({len(named)} model(s); the files stay)"):
        say("nothing forgotten (answer y, or pass --yes)")
        return 1
    registry.forget_added(root)
    if opts.json:
        fmt.print_json({"folder": str(root), "action": "forget", "forgot": [e.name for e in named], "deleted": []})
    else:
        say(f"forgot the folder {root}: {len(named)} model(s) (the files stay)")
    return 0


def _confirm(what: str) -> bool:
    print(f"localllm: {fmt.safe(what)}? [y/N] ", end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.strip().lower() in ("y", "yes")
