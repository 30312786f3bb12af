"""``localllm list --sessions``: the saved sessions (the cockpit's and ``chat``'s),
each with the KV state kept beside it, and what they all hold against the disk
budget (``chat.kept``), so a user sees what reopens without a prefill and what
the budget has dropped."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.chat import kept, sessions
from localllm.util import fmt

TITLE_WIDTH = 40


def kv_state(s: sessions.SavedSession, files: dict[str, kept.StateFile]) -> tuple[str, int | None]:
    """What is kept of ``s``'s KV cache, and the state file's bytes (None: no file):
    kept (marked, on disk), dropped (marked, its file gone: the budget, or deleted),
    outdated (a file from before the conversation moved on: written over when it is
    left again), none."""
    f = files.get(s.id)
    if s.kv is not None:
        return ("kept", f.bytes) if f is not None else ("dropped", None)
    return ("outdated", f.bytes) if f is not None else ("none", None)


def rows(on_skip: Any = None) -> tuple[list[dict[str, Any]], int, int]:
    """Each saved session (newest first) as ``--json`` shows it, the bytes every
    state file holds (those of deleted sessions too), and the budget."""
    folder = sessions.sessions_dir()
    files = {f.session_id: f for f in kept.state_files(folder)}
    out = []
    for s in sessions.list_sessions(on_skip):
        state, size = kv_state(s, files)
        out.append({"id": s.id, "title": s.title, "model": s.model, "turns": s.turns, "created": s.created or None,
                    "updated": s.updated or None, "kv_state": state, "kv_state_bytes": size,
                    "kv_cells": s.kv["cells"] if s.kv is not None and size is not None else None})
    return out, sum(f.bytes for f in files.values()), kept.budget()


def _skipped(path: Path, reason: str) -> None:
    print(f"localllm: skipped {fmt.safe(reason)}", file=sys.stderr)


def run(*, as_json: bool) -> int:
    table, held, budget = rows(_skipped)
    if as_json:
        fmt.print_json({"folder": str(sessions.sessions_dir()), "sessions": table, "kv_state_bytes": held, "kv_budget_bytes": budget})
        return 0
    if not table:
        print(f"no saved sessions (in {fmt.safe(sessions.sessions_dir())})")
    else:
        head = ("ID", "MODEL", "TURNS", "UPDATED", "KV STATE", "TITLE")
        body = [(r["id"], Path(r["model"]).name, str(r["turns"]),
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated"])) if r["updated"] else "-",
                 _state(r), _elide(r["title"])) for r in table]
        print(fmt.table(head, body, right=(2, 4)))
    print(f"kept KV state: {fmt.size(held)} of a {fmt.size(budget)} budget (the oldest state files go first; "
          f"[{kept.TABLE}] {kept.KEY} in {fmt.safe(paths.config_file())})")
    return 0


def _state(r: dict[str, Any]) -> str:
    if r["kv_state_bytes"] is None:
        return "dropped" if r["kv_state"] == "dropped" else "-"
    size = fmt.size(r["kv_state_bytes"])
    return size if r["kv_state"] == "kept" else f"{size} (outdated)"


def _elide(title: str) -> str:
    return title if len(title) <= TITLE_WIDTH else title[: TITLE_WIDTH - 1] + "…"
