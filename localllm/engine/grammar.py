"""Constrained decoding: GBNF grammars for llama.cpp's grammar sampler.

``response_format`` (OpenAI) and llama-server's ``grammar``/``json_schema``
fields become a GBNF text here: a JSON schema through llama-cpp-python's
converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``, the port of
llama.cpp's json-schema-to-grammar), and ``json_object`` as the schema
``{"type": "object"}`` (its whitespace is bounded, so a small model cannot pad
a reply with blanks forever). ``check`` asks llama.cpp itself whether a grammar
parses, before any request is admitted.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from typing import Any

import llama_cpp
from llama_cpp import llama_grammar

from localllm.errors import InputError


def from_json_schema(schema: dict[str, Any]) -> str:
    """The GBNF of a JSON schema; an ``InputError`` naming what the converter refused."""
    try:
        return llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    except (ValueError, KeyError, TypeError, RecursionError, NotImplementedError, AssertionError) as exc:
        raise InputError(f"the JSON schema cannot be turned into a grammar: {type(exc).__name__}: {exc}"[:300]) from None


def json_object() -> str:
    """Any JSON object (``response_format: {"type": "json_object"}``)."""
    return from_json_schema({"type": "object"})


def init(vocab: object, text: str, triggers: Sequence[str] = ()) -> object:
    """llama.cpp's grammar sampler for ``text`` (root rule ``root``); an
    ``InputError`` when llama.cpp cannot parse it (it returns no sampler).
    With ``triggers`` (regexes, llama.cpp's lazy grammar) the reply is free
    until one matches, and held to the grammar from its first capture group:
    a pattern written ``^...$`` must match all the text so far, so that what
    llama.cpp replays into the grammar is exactly the capture (a token running
    past it could hold text the grammar refuses, and llama.cpp aborts then)."""
    if triggers:
        patterns = [p.encode("utf-8") for p in triggers]
        arr = (ctypes.c_char_p * len(patterns))(*patterns)
        sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, text.encode("utf-8"), b"root", arr, len(patterns), None, 0)
    else:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
    if not sampler:
        raise InputError("the grammar does not parse (llama.cpp's GBNF parser refused it: see its grammars/README.md)")
    return sampler


def check(vocab: object, text: str) -> None:
    """Raise ``InputError`` unless llama.cpp parses ``text``."""
    llama_cpp.llama_sampler_free(init(vocab, text))
