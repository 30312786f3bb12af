"""The models the router serves: ``localllm list``'s, by name, and nothing else.

A request's ``model`` is a name for the registry (``registry.find``), never a
path: the router does not call ``resolver.resolve``, which tries the name as a
file first, so ``../../etc/passwd`` or ``/tmp/x.gguf`` cannot make it open a
file that is not in the list. A name shaped like a path, one with control
characters or one past ``MAX_NAME`` is refused before the registry is asked.

The registry reads folders and small JSON files (``discover``: a few ms); the
entries are kept ``TTL_S`` and read again at once when a name is not in them
(at most once per ``MISS_S``, so a flood of unknown names cannot keep the disk
busy), so a model added or pulled while the router runs is served without a
restart.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localllm.errors import InputError
from localllm.modelfile.model_info import inspect_model
from localllm.store import registry, resolver
from localllm.store.registry import ModelEntry

MAX_NAME = 256
TTL_S = 5.0
MISS_S = 1.0
NOT_FOUND_HINT = "localllm list shows the models here; localllm pull OWNER/REPO downloads one, localllm add PATH names your own"


class BadName(Exception):
    """A ``model`` no registry name can be (a 400)."""


class Unknown(Exception):
    """A well-formed name the router does not serve (a 404)."""


def check_name(name: object) -> str:
    """``name`` if it can be a model's name, else ``BadName`` saying why."""
    if not isinstance(name, str):
        raise BadName(f"'model' must be a string, not {type(name).__name__}")
    if not name.strip():
        raise BadName("'model' is empty: name a model (GET /v1/models lists them)")
    if len(name) > MAX_NAME:
        raise BadName(f"'model' has {len(name)} characters: a model's name has at most {MAX_NAME}")
    if not name.isprintable():
        raise BadName("'model' holds control characters: no model's name has them")
    if name.startswith(("/", ".", "~", "\\")) or "\\" in name or ".." in name:
        raise BadName("'model' is a model's name from localllm list, not a path")
    return name


@dataclass(frozen=True)
class Facts:
    """What the listings say of a model file, from its header: read once per file version."""

    size: int | None
    modified: float | None  # the file's mtime
    architecture: str | None = None
    file_type: str | None = None
    n_params: int | None = None


class Catalog:
    """The served models: every entry of ``discover()``, or only those named by ``only``."""

    def __init__(self, only: Iterable[str] | None = None, discover: Callable[[], list[ModelEntry]] = registry.discover) -> None:
        self.only = frozenset(n.lower() for n in only) if only is not None else None
        self._discover = discover
        self._entries: list[ModelEntry] = []
        self._read_at = -1e9
        self._lock = asyncio.Lock()
        self._facts: dict[tuple[str, int, int], Facts] = {}

    def served(self, entries: list[ModelEntry]) -> list[ModelEntry]:
        return [e for e in entries if self.only is None or e.name.lower() in self.only]

    def invalidate(self) -> None:
        """Read the registry again at the next use (a model pulled or deleted through the router)."""
        self._read_at = float("-inf")

    async def entries(self, *, fresh: bool = False) -> list[ModelEntry]:
        """The served entries, read again when older than ``TTL_S`` (``fresh``: ``MISS_S``)."""
        async with self._lock:
            if time.monotonic() - self._read_at > (MISS_S if fresh else TTL_S):
                self._entries = await asyncio.to_thread(self._discover)
                self._read_at = time.monotonic()
            return self.served(self._entries)

    async def find(self, name: object) -> ModelEntry:
        """The served entry ``name`` means; ``BadName`` or ``Unknown`` otherwise."""
        name = check_name(name)
        for fresh in (False, True):
            entries = await self.entries(fresh=fresh)
            found = _find(name, entries)
            if found is not None:
                return found
        if self.only is not None:
            raise Unknown(f"model '{name}' is not served here (this router serves {', '.join(sorted(self.only))}: --models)")
        raise Unknown(f"model '{name}' not found: {NOT_FOUND_HINT}")

    async def facts(self, entry: ModelEntry) -> Facts:
        """The listings' facts of ``entry``'s file (nothing but its name for a built-in not assembled yet)."""
        try:
            st = entry.path.stat()
        except OSError:
            return Facts(size=None, modified=None)
        key = (str(entry.path), st.st_size, st.st_mtime_ns)
        known = self._facts.get(key)
        if known is None:
            try:
                info = await asyncio.to_thread(inspect_model, entry.path)
                known = Facts(st.st_size, st.st_mtime, info.architecture, info.file_type, info.n_params)
            except Exception:  # a damaged file is listed with what its stat says; loading it will say why
                known = Facts(st.st_size, st.st_mtime)
            self._facts[key] = known
        return known


def _find(name: str, entries: list[ModelEntry]) -> ModelEntry | None:
    """``registry.find`` over the served entries; Ollama's ``:latest`` (which the
    router's /api/tags adds to a name without a tag, as Ollama lists them) is dropped."""
    try:
        found = registry.find(name, entries)
        if found is None and name.lower().endswith(":latest"):
            found = registry.find(name[: -len(":latest")], entries)
    except InputError as exc:  # a name that several quants share
        raise BadName(str(exc)) from None
    return found


def served_names(names: list[str], entries: list[ModelEntry]) -> list[str]:
    """``--models NAME,NAME``: each name's entry (its canonical name), or an
    InputError naming the unknown ones and where the names are."""
    out, unknown = [], []
    for name in names:
        found = registry.find(name, entries)
        if found is None:
            unknown.append(name)
        elif found.name not in out:
            out.append(found.name)
    if unknown:
        raise InputError(f"--models: {', '.join(repr(n) for n in unknown)} not found: {NOT_FOUND_HINT}")
    return out


def path_of(entry: ModelEntry) -> Path:
    """The file to load for ``entry`` (blocking: a built-in model is assembled on first use)."""
    builtin = resolver.find_entry(entry.name) if entry.source == "embedded" else None
    path = resolver.path_of(builtin) if builtin is not None else entry.path
    if not os.path.isfile(path):
        raise InputError(f"{entry.name}: {path} is gone (see localllm list)")
    return Path(path)
