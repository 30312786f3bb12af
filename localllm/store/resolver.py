"""Resolve what the user typed as a model into a GGUF path.

The top of the store layer: it asks the built-in models
(``localllm.store.builtin``) and then the registry (``localllm.store.registry``:
pulled, Hugging Face cache, LM Studio, Ollama, added). Both sit below this
module and neither imports it, so there is no import cycle. The built-in
names are re-exported here because callers already import them from here.
"""

from __future__ import annotations

import os
from pathlib import Path

from localllm.errors import InputError
from localllm.store import registry
from localllm.store.builtin import CATALOG, DEFAULT_MODEL, CatalogEntry, embedded_path, find_entry, path_of

__all__ = ["CATALOG", "DEFAULT_MODEL", "CatalogEntry", "embedded_path", "find_entry", "looks_like_path", "resolve"]


def looks_like_path(name: str) -> bool:
    return (
        name.endswith(".gguf")
        or os.sep in name
        or "/" in name
        or name.startswith(".")
        or Path(name).exists()
    )


def hub_name(name: str):
    """The Hub model (``names.HubName``) a catalog name or ``owner/repo[:QUANT]``
    stands for, or None."""
    # lazy: the catalog loads the planner (gguf, numpy: ~90 ms here), asked only for names nothing else knows
    from localllm.store import names

    return names.parse(name)


def locate_hub(name: str) -> Path | None:
    """The cached file of a Hub name; ``names.NotDownloaded`` when it is not
    downloaded; None when ``name`` is no Hub name."""
    h = hub_name(name)
    if h is None:
        return None
    # lazy: as hub_name
    from localllm.store import names

    found = names.cached(h)
    if found is None:
        raise names.NotDownloaded(h)
    return found


def resolve(name: str | None) -> Path:
    """Return the GGUF path for a model argument (``None`` means the default).

    An existing path wins; then the embedded names; then the registry (pulled,
    Hugging Face cache, LM Studio, Ollama, added folders); then anything shaped
    like a path is passed on, for the loader to report as missing."""
    if name is None:
        name = DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.exists():
        return path
    entry = find_entry(name)
    if entry is not None:
        return path_of(entry)
    found = registry.find(name)
    if found is not None:
        if found.source == "embedded":
            return resolve(found.name)
        return found.path
    located = locate_hub(name)
    if located is not None:
        return located
    if looks_like_path(name):
        return path
    builtin = ", ".join(e.name for e in CATALOG)
    raise InputError(
        f"unknown model '{name}': not a file and not a known name (built in: {builtin}; see localllm list; "
        "localllm pull OWNER/REPO downloads one, localllm add PATH names your own)"
    )
