"""A model's vocabulary alone (llama.cpp's ``vocab_only``), in this process: what
a grammar is parsed and walked against, and what tokenizes without weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def vocab_only(path: Path) -> Iterator[object]:
    """``path``'s llama.cpp vocabulary, freed with its model at the end."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    try:
        yield llama_cpp.llama_model_get_vocab(model)
    finally:
        llama_cpp.llama_model_free(model)
