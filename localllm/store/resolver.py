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


# Linux's PATH_MAX and NAME_MAX (limits.h); macOS allows less (1024, 255). A name past
# them names no file: stat() raises ENAMETOOLONG instead of answering "no".
_MAX_PATH, _MAX_PART = 4096, 255


def shown(name: str) -> str:
    """``name`` for a message: whole when short, else its start and its length (a
    10 KB name echoed back is a screen of noise)."""
    return name if len(name) <= 80 else f"{name[:60]}… ({len(name)} characters)"


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; False where the OS refuses to look (a name too long,
    a loop of links, a NUL byte) rather than an OSError."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def check_name(name: str) -> None:
    """An InputError naming the problem for a model argument no file can have."""
    if "\0" in name:
        raise InputError(f"model name '{shown(name.replace(chr(0), '?'))}' holds a NUL byte: no file or model has one")
    if len(name.encode("utf-8", "surrogateescape")) > _MAX_PATH or any(
            len(part.encode("utf-8", "surrogateescape")) > _MAX_PART for part in Path(name).parts):
        raise InputError(f"model name too long: '{shown(name)}' (a path may have {_MAX_PATH} bytes and each of its parts "
                         f"{_MAX_PART}; see localllm list for the names)")


def looks_like_path(name: str) -> bool:
    return (
        name.endswith(".gguf")
        or os.sep in name
        or "/" in name
        or name.startswith(".")
        or _exists(Path(name))
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
    check_name(name)
    path = Path(name).expanduser()
    if _exists(path):
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
        f"unknown model '{shown(name)}': not a file and not a known name (built in: {builtin}; see localllm list; "
        "localllm pull OWNER/REPO downloads one, localllm add PATH names your own)"
    )
