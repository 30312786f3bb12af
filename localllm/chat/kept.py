"""The disk budget of saved sessions' kept KV caches (``<id>.state``, ``chat.resume``).

A state file is as large as the cache it holds (SmolLM2 at 3,000 tokens: tens of
MiB; a 7B model at 32k: gigabytes), and every conversation left is kept, so
without a bound the sessions folder would grow with every chat. After a state
file is written, the oldest ones (by modification time: the conversations left
longest ago) are deleted until all of them fit the budget, the new one last of
all. Only the state goes: the session file stays, and reopened it says "its
state file is gone" and reads the conversation again.

The budget is the config file's ``[sessions]`` table, ``kv-budget = "4GiB"``
(0 keeps none), default 2 GiB. It is a table of its own, not a flag: the
cockpit and ``chat`` both write state files, and one budget must hold for both.
This module stays light (no model, no session code): the config file's check
(``commands/config_file``) imports it on every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.errors import UsageError
from localllm.util import config_toml
from localllm.util.units import GiB, parse_size

TABLE = "sessions"  # [sessions] in the config file
KEY = "kv-budget"
DEFAULT_BUDGET = 2 * GiB
SUFFIX = ".state"


def parse_settings(value: Any, path: Path) -> int:
    """The ``[sessions]`` table's budget in bytes, checked (the config file is
    outside data): a bad key or size is one line naming the file and the fix."""
    if not isinstance(value, dict):
        raise UsageError(f'{path}: {TABLE} must be a table: [{TABLE}] with {KEY} = "2GiB"')
    unknown = [k for k in value if k != KEY]
    if unknown:
        raise UsageError(f"{path}: [{TABLE}] has no key {unknown[0]!r} (it takes {KEY})")
    if KEY not in value:
        return DEFAULT_BUDGET
    raw = value[KEY]
    if raw == 0 and not isinstance(raw, bool):
        return 0
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise UsageError(f'{path}: [{TABLE}] {KEY} = {raw!r}: give a size such as "2GiB", or 0 to keep no KV cache')
    try:
        return int(parse_size(str(raw)))
    except UsageError as exc:
        raise UsageError(f"{path}: [{TABLE}] {KEY}: {exc}") from None


def budget(config: Path | None = None) -> int:
    """The budget the config file sets (``paths.config_file``), else the default."""
    where = config or paths.config_file()
    table = config_toml.read(where)
    return parse_settings(table[TABLE], where) if TABLE in table else DEFAULT_BUDGET


@dataclass(frozen=True)
class StateFile:
    path: Path
    bytes: int
    mtime: float

    @property
    def session_id(self) -> str:
        return self.path.name[: -len(SUFFIX)]


def state_files(folder: Path) -> list[StateFile]:
    """The state files in ``folder``, oldest first; one that vanishes while
    read (another process dropped it) is left out."""
    out = []
    for p in folder.glob(f"*{SUFFIX}") if folder.is_dir() else ():
        try:
            st = p.stat()
        except OSError:
            continue
        if p.is_file():
            out.append(StateFile(p, st.st_size, st.st_mtime))
    return sorted(out, key=lambda f: (f.mtime, f.path.name))


def total(folder: Path) -> int:
    """Bytes the state files in ``folder`` hold."""
    return sum(f.bytes for f in state_files(folder))


def evict(folder: Path, limit: int, newest: Path | None = None) -> list[Path]:
    """Delete state files in ``folder``, oldest first, until they hold at most
    ``limit`` bytes; ``newest`` (the one just written) goes last, whatever its
    time says. Returns the files deleted."""
    files = state_files(folder)
    if newest is not None:
        files = [f for f in files if f.path != newest] + [f for f in files if f.path == newest]
    held = sum(f.bytes for f in files)
    dropped = []
    for f in files:
        if held <= limit:
            break
        f.path.unlink(missing_ok=True)
        held -= f.bytes
        dropped.append(f.path)
    return dropped
