"""A model's vocabulary alone (llama.cpp's ``vocab_only``), in this process: what
a grammar is parsed and walked against, and what tokenizes without weights."""

from __future__ import annotations

import contextlib
import ctypes
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


def grammar_takes(tok, gbnf: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets ``text`` through, token by token (SmolLM2's tokens)."""
    import llama_cpp

    from localllm.engine import grammar

    sampler = grammar.init(tok.vocab, gbnf)
    try:
        for t in tok.tokenize(text, add_special=False):
            one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(t, 0.0, 0.0))
            arr = llama_cpp.llama_token_data_array(one, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
            if one[0].logit == float("-inf"):
                return False
            llama_cpp.llama_sampler_accept(sampler, t)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)
