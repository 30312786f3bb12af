"""The model's section of the config file that ``tune`` writes, and reads back.

``tune`` keeps its choices in the model's ``[models."NAME"]`` table (the shape
``commands/config_file.py`` gives every command that loads the model: each key a
flag, a flag typed on the command line still wins), with a ``tuned`` record of
what it wrote and when::

    [models."smollm2"]
    ctx = 8192                     # the user's: kept
    # localllm tune, 2026-12-03 14:02: ...
    ubatch = 256
    flash-attn = "on"
    tuned = { date = "2026-12-03 14:02", ubatch = 256, flash-attn = "on" }

The record is how ``plan`` says "(from tune, DATE)" and how a later ``tune``
tells its own keys from the user's: a key that still holds the recorded value is
tune's to replace; one edited since is the user's, kept and not tuned. The file
is the user's: only those lines change, the rest of the text stays byte for
byte, and the result is parsed again and compared before it replaces the file
(atomically: an interrupted write leaves the old file or the new one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.errors import UsageError
from localllm.tune.candidates import FLASH_ATTN, KV_TYPE, THREADS, UBATCH
from localllm.util import atomic, config_toml

MODELS = "models"
TUNED = "tuned"
KEYS = (UBATCH, FLASH_ATTN, KV_TYPE, THREADS)
# every config key that sets one of them (a flag's other long names), and the logical batch that caps the physical one
ALIASES = {UBATCH: ("ubatch", "ubatch-size"), FLASH_ATTN: ("flash-attn",), THREADS: ("threads",),
           KV_TYPE: ("kv-type", "k-type", "cache-type-k", "v-type", "cache-type-v"), "batch": ("batch", "batch-size")}
COMMENT = "# localllm tune"
_HEADER = re.compile(r"^\s*\[(?!\[)")
_KEY_LINE = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


@dataclass(frozen=True)
class Record:
    """What ``tune`` wrote into a model's table, and when."""

    date: str
    settings: dict[str, Any]
    partial: bool = False  # interrupted: only the stages measured by then


@dataclass(frozen=True)
class FromTune:
    """The settings a command runs with that came from ``tune`` (a typed flag or an edit since is not)."""

    date: str
    settings: dict[str, Any]
    partial: bool

    def line(self) -> str:
        """``ubatch 256, flash-attn on (from tune, 2026-12-03 14:02)``."""
        what = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        return f"{what} (from tune, {self.date}{', interrupted: partly measured' if self.partial else ''})"

    def to_dict(self) -> dict[str, Any]:
        return {"date": self.date, "settings": dict(self.settings), "partial": self.partial}


def model_entry(table: Mapping[str, Any], model: str | None) -> tuple[str, dict[str, Any]] | None:
    """``[models."NAME"]`` for ``model`` (the name as given, or a path's file name
    without .gguf; case does not matter): its name as the file spells it, and its
    table. The one matching rule: ``config_file.model_table`` uses it too."""
    models = table.get(MODELS)
    if not model or not isinstance(models, dict):
        return None
    wanted = {model.lower(), Path(model).name.lower().removesuffix(".gguf")}
    for name, settings in models.items():
        if name.lower() in wanted and isinstance(settings, dict):
            return name, settings
    return None


def table_name(model: str) -> str:
    """The name of a new table for ``model``: a path's file name without .gguf, else the name as given."""
    return Path(model).name.removesuffix(".gguf") if "/" in model or model.lower().endswith(".gguf") else model


def check_record(value: object, where: str) -> Record:
    """A ``tuned`` value as ``tune`` writes it, or one line naming ``where`` (the file and table) and the fix."""
    fix = f"{where} tuned = {value!r}: not what localllm tune writes ({{ date = \"...\", ubatch = 256, ... }}): delete the key"
    if not isinstance(value, dict) or not isinstance(value.get("date"), str) or not isinstance(value.get("partial", False), bool):
        raise UsageError(fix)
    settings = {k: v for k, v in value.items() if k not in ("date", "partial")}
    if any(k not in KEYS or isinstance(v, bool) or not isinstance(v, (int, str)) for k, v in settings.items()):
        raise UsageError(fix)
    return Record(value["date"], settings, bool(value.get("partial", False)))


def record_of(entry: Mapping[str, Any] | None, where: str = "") -> Record | None:
    return None if entry is None or TUNED not in entry else check_record(entry[TUNED], where)


def user_settings(table: Mapping[str, Any], model: str) -> dict[str, tuple[Any, str]]:
    """The settings the user fixed in the file, by tune's key: the top level's and
    the model table's, less the keys ``tune`` wrote there and nobody changed.
    Each with where it is set (``[models."smollm2"] threads``). A command's own
    table ([run]) is not read: the model table that tune writes wins over it."""
    found = model_entry(table, model)
    record = record_of(found[1]) if found else None
    mine = {k for k, v in (record.settings.items() if record else ()) if found and found[1].get(k) == v}
    out: dict[str, tuple[Any, str]] = {}
    for key, names in ALIASES.items():
        for n in names:
            if n in table and not isinstance(table[n], dict):
                out[key] = (table[n], f"{n} (top level)")
        if found is not None:
            for n in names:
                if n in found[1] and n not in mine:
                    out[key] = (found[1][n], f'{n} in [models."{found[0]}"]')
    return out


def flag_values(*, ubatch: int | None, flash_attn: str | None, kv_type: str | None, threads: int | None) -> dict[str, Any]:
    """The tuned settings a loading command's options hold now (after the config file and typed flags)."""
    return {UBATCH: ubatch, FLASH_ATTN: flash_attn, KV_TYPE: kv_type, THREADS: threads}


def from_tune(table: Mapping[str, Any], model: str | None, effective: Mapping[str, Any]) -> FromTune | None:
    """The settings of ``effective`` (``flag_values``) that ``tune`` set for ``model``:
    recorded, still in the table as recorded, and not overridden by a flag."""
    found = model_entry(table, model)
    record = record_of(found[1]) if found else None
    if found is None or record is None:
        return None
    same = {k: v for k, v in record.settings.items() if found[1].get(k) == v and effective.get(k) == v}
    return FromTune(record.date, same, record.partial) if same else None


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml(name)


def _header_path(line: str) -> list[str] | None:
    """The key path of a ``[table]`` header line (TOML's own parser reads it: quotes, dots, spaces), None if not one."""
    if not _HEADER.match(line):
        return None
    try:
        node: Any = config_toml.tomllib.loads(line if line.endswith("\n") else line + "\n")
    except (config_toml.tomllib.TOMLDecodeError, RecursionError):
        return None
    keys: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        k = next(iter(node))
        keys.append(k)
        node = node[k]
    return keys


def _unquote(key: str) -> str:
    return json.loads(key) if key.startswith('"') else key.strip("'")


def updated(text: str, path: Path, model: str, settings: Mapping[str, Any], date: str, *, partial: bool = False) -> str:
    """``text`` with ``settings`` and their record in ``model``'s table: tune's
    earlier keys and comment replaced, everything else kept. Raises UsageError
    (one line naming the file and what to do) where the file's shape does not
    allow it; the result is checked to parse as exactly that."""
    table = config_toml.parse(text, path) if text.strip() else {}
    if MODELS in table and not isinstance(table[MODELS], dict):
        raise UsageError(f"{path}: models = {table[MODELS]!r} leaves no room for tune's [models.\"{table_name(model)}\"]: "
                         "move that key into a [serve] table")
    found = model_entry(table, model)
    name = found[0] if found else table_name(model)
    where = f'{path}: [models."{name}"]'
    old = dict(found[1]) if found else {}
    record = record_of(old, where)
    drop = {TUNED} | {k for k, v in (record.settings.items() if record else ()) if old.get(k) == v}
    rec = {"date": date, **settings, **({"partial": True} if partial else {})}
    block = [f"{COMMENT}, {date}: the fastest settings measured here{' (interrupted: partly measured)' if partial else ''}; "
             f"run it again to refresh them, or delete these lines\n",
             *(f"{_key(k)} = {_toml(v)}\n" for k, v in settings.items()),
             f"{TUNED} = {{ {', '.join(f'{_key(k)} = {_toml(v)}' for k, v in rec.items())} }}\n"]
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    headers = [(i, _header_path(line)) for i, line in enumerate(lines)]
    headers = [(i, p) for i, p in headers if p is not None]
    at = next((i for i, p in headers if p == [MODELS, name]), None)
    if found is not None and at is None:
        raise UsageError(f"{where} is not a table of its own (a dotted key or an inline table): "
                         f"write it as [models.\"{name}\"] with one key a line, then run tune again")
    if at is None:
        out = [*lines, *(["\n"] if lines else []), f"[{MODELS}.{_toml(name)}]\n", *block]
    else:
        end = next((i for i, _ in headers if i > at), len(lines))
        kept = []
        for line in lines[at + 1:end]:
            m = _KEY_LINE.match(line)
            if line.lstrip().startswith(COMMENT) or (m and _unquote(m.group(1)) in drop):
                continue
            kept.append(line)
        out = [*lines[: at + 1], *block, *kept, *lines[end:]]
    new_text = "".join(out)
    want = dict(table)
    want[MODELS] = {**table.get(MODELS, {}), name: {**{k: v for k, v in old.items() if k not in drop}, **settings, TUNED: rec}}
    try:
        got = config_toml.parse(new_text, path)
    except UsageError:
        got = None
    if got != want:
        raise UsageError(f"{where} cannot be updated in place in this file: add "
                         + "; ".join(line.strip() for line in block[1:]) + " to it by hand")
    return new_text


def write(path: Path, model: str, settings: Mapping[str, Any], date: str, *, partial: bool = False) -> str:
    """``updated`` on the file as it is now, written atomically; returns the table's name."""
    text = config_toml.read_text(path) or ""
    new_text = updated(text, path, model, settings, date, partial=partial)
    atomic.write_text(path, new_text)
    table = config_toml.parse(new_text, path)
    found = model_entry(table, model)
    return found[0] if found else table_name(model)


def check_writable(path: Path, model: str) -> None:
    """Raise now, before anything is measured, where ``write`` would refuse later."""
    updated(config_toml.read_text(path) or "", path, model, {UBATCH: 512}, "2000-01-01 00:00")
