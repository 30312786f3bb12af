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
from pathlib import Path

from localllm.commands._common import say
from localllm.errors import InputError
from localllm.store import registry, removal
from localllm.util import fmt


def run(args: argparse.Namespace) -> int:
    folder = _added_folder(args.name)
    if folder is not None:
        return _forget_folder(folder, args)
    entry = registry.find(args.name)
    if entry is None:
        raise InputError(f"no model named '{args.name}' (see localllm list)")
    refused = removal.refusal(entry)
    if refused is not None:
        raise InputError(refused)
    action = removal.action(entry)
    size = entry.path.stat().st_size if entry.path.exists() else 0
    what = f"{action} {entry.name} ({fmt.size(size)}, {entry.path})"
    if not args.yes and not _confirm(what):
        say("nothing deleted (answer y, or pass --yes)")
        return 1
    deleted = removal.remove(entry).deleted
    if args.json:
        fmt.print_json({"name": entry.name, "source": entry.source, "action": action, "deleted": deleted, "path": str(entry.path)})
    elif entry.source == "added":
        say(f"forgot {entry.name} ({entry.path}; the file stays: localllm did not store it; localllm add {entry.path} brings it back)")
    else:
        say(f"deleted {entry.name}: " + ", ".join(deleted))
    return 0


def _added_folder(name: str) -> Path | None:
    """``rm FOLDER``: the added folder ``name`` is, or None."""
    p = Path(name).expanduser()
    if not p.is_dir():
        return None
    root = p.resolve()
    return root if str(root) in registry.load_record().added else None


def _forget_folder(root: Path, args: argparse.Namespace) -> int:
    """Forget an added folder and every model in it (the files stay)."""
    named = [e for e in registry.discover() if e.source == "added" and root in e.path.parents]
    if not args.yes and not _confirm(f"forget the folder {root} ({len(named)} model(s); the files stay)"):
        say("nothing forgotten (answer y, or pass --yes)")
        return 1
    registry.forget_added(root)
    if args.json:
        fmt.print_json({"folder": str(root), "action": "forget", "forgot": [e.name for e in named], "deleted": []})
    else:
        say(f"forgot the folder {root}: {len(named)} model(s) (the files stay)")
    return 0


def _confirm(what: str) -> bool:
    print(f"localllm: {fmt.safe(what)}? [y/N] ", end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.strip().lower() in ("y", "yes")
