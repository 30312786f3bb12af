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
import time
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_grammar

from localllm.errors import InputError

# Bounds on what a request may ask the grammar machinery to build (issue 45). A
# schema becomes GBNF through llama-cpp-python's Python converter, then llama.cpp
# parses the GBNF (a recursive descent: 20,000 nested parentheses overflowed its
# stack and killed serve) and runs it at every sampled token (an enum of 90,000
# strings cost 13-18 s a token on the engine thread, stalling every client).
MAX_SCHEMA_BYTES = 256 * 1024  # the schema as JSON
MAX_GRAMMAR_BYTES = 128 * 1024  # the GBNF text, given or converted (a tool schema's is a few KB)
MAX_GRAMMAR_DEPTH = 128  # nested groups in the GBNF text
MAX_REPEAT = 65_536  # minLength/maxItems/... and GBNF {m,n}: no reply is that long in characters or items
# The size bound is not a time bound: the grammar's cost a token grows with its
# live alternatives times the vocabulary (measured here, SmolLM2's 49,152 tokens,
# one filter of the whole vocabulary: {"type": "object"} 15 ms, an enum of 100
# strings 35 ms, of 1,000 336 ms, of 5,000 1.3 s; Gemma 3's 262,144 tokens cost
# about 5x). A grammar whose filter takes longer than this on the engine thread
# is refused when it is checked (timed once, off the engine thread), and a
# request whose grammar passes that check but takes longer at a later token
# (a prefix before a long alternation) is ended at that token
# (checked_sampler.CheckedSampler): one slow step, never a stall of every token.
# Timed in the thread's CPU time: a busy machine's wait is not the grammar's
# cost (a CI run under load refused bench_tools' two-tool grammar by wall time).
MAX_STEP_SECONDS = 0.25
# llama.cpp's llama_token_data, as a numpy record: a candidates array filled without a Python loop
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")


def from_json_schema(schema: dict[str, Any]) -> str:
    """The GBNF of a JSON schema; an ``InputError`` naming what the converter
    refused, or the bound a schema passes (before the converter runs). The
    schema is first read as the vendored llama.cpp reads it (``as_llama``)."""
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_BYTES:
        raise InputError(f"the JSON schema is {len(text) // 1024} KiB; at most {MAX_SCHEMA_BYTES // 1024} KiB is compiled into a grammar")
    _check_schema_counts(schema)
    llama_grammar._build_repetition = repetition  # the vendored llama.cpp's rule: see ``repetition``
    try:
        gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(as_llama(schema)))
    except (ValueError, KeyError, TypeError, RecursionError, NotImplementedError, AssertionError, AttributeError, IndexError) as exc:
        raise InputError(f"the JSON schema cannot be turned into a grammar: {type(exc).__name__}: {exc}"[:300]) from None
    if len(gbnf.encode("utf-8")) > MAX_GRAMMAR_BYTES:
        raise InputError(f"the JSON schema compiles to {len(gbnf.encode('utf-8')) // 1024} KiB of grammar; at most "
                         f"{MAX_GRAMMAR_BYTES // 1024} KiB is run at every token (a long enum or a large repetition count is the usual cause)")
    return gbnf


def repetition(item_rule: str, min_items: int, max_items: int | None, separator_rule: str | None = None,
               item_rule_is_literal: bool = False) -> str:
    """A repetition as the vendored llama.cpp's converter writes it
    (common/json-schema-to-grammar.cpp, ``build_repetition``): GBNF's own
    ``{m,n}``, which llama.cpp's parser expands into rules itself, without
    recursing. llama-cpp-python's older Python port, which this replaces in its
    module, writes ``x{0,256}`` as 256 nested optional groups: a ``maxLength``
    of 256 (Claude Code's tools have several) nested deeper than the parser's
    recursion bound (``MAX_GRAMMAR_DEPTH``) and wrote 50 KiB of grammar."""
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return f"{item_rule}?"
    if not separator_rule:
        if item_rule_is_literal and min_items == max_items:  # a pattern's literal repeated: one literal, as the port writes it
            return '"' + item_rule[1:-1] * min_items + '"'
        if min_items == 1 and max_items is None:
            return f"{item_rule}+"
        if min_items == 0 and max_items is None:
            return f"{item_rule}*"
        return f"{item_rule}{{{min_items},{'' if max_items is None else max_items}}}"
    rest = repetition(f"({separator_rule} {item_rule})", max(min_items - 1, 0), None if max_items is None else max_items - 1)
    result = f"{item_rule} {rest}".rstrip()
    return f"({result})?" if min_items == 0 else result


def _check_schema_counts(schema: Any) -> None:
    """Every lower repetition bound in ``schema`` (any depth, walked without
    recursion) at most MAX_REPEAT: a reply that must be that long is refused.
    An upper bound is not checked: ``as_llama`` drops those llama.cpp ignores."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in _COUNTS:
                v = node.get(key)
                if key.startswith("min") and isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_REPEAT:
                    raise InputError(f"the JSON schema's {key} is {v}; at most {MAX_REPEAT} (no reply in a context is that long)")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# What makes a schema more than "any JSON value" to the vendored llama.cpp
# (common/json-schema.cpp, build_node: with no type, "the structural keywords
# decide"; with none of them the node is common_chat_schema_any).
_STRUCTURAL = frozenset({"$ref", "oneOf", "anyOf", "allOf", "const", "enum", "type", "properties", "additionalProperties",
                         "items", "prefixItems", "pattern", "minLength", "maxLength", "format"})
_ANY = {"type": ["object", "array", "string", "number", "boolean", "null"]}  # "any value" in the Python converter's terms
# llama.cpp's GBNF parser reads a repetition {m,n} with n over this as {m,}
# (src/llama-grammar.cpp, MAX_REPETITION_THRESHOLD): such an upper bound binds nothing.
LLAMA_REPETITION_THRESHOLD = 2000
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def as_llama(schema: Any) -> Any:
    """``schema`` as the vendored llama.cpp's converter reads it, in terms
    llama-cpp-python's older Python port (which asserts on the first and
    compiles the second into thousands of rules) understands:

    - a schema with no type and no structural keyword, such as a property with
      only a ``description`` (Claude Code's tools have them), is any JSON value,
      as ``common/json-schema.cpp`` decides; the Python port asserts on it;
    - an upper bound (``maxLength``, ``maxItems``, ...) above
      ``LLAMA_REPETITION_THRESHOLD`` is dropped: llama.cpp's parser makes such a
      repetition unbounded anyway, and the Python port would write it as that many
      nested rules (Claude Code's ``Workflow`` tool has ``maxLength`` 524288).

    A copy; ``schema`` is left as it is. Walked with a stack, not recursion."""
    if not isinstance(schema, dict):
        return schema
    root = dict(schema)
    stack: list[dict] = [root]
    while stack:
        node = stack.pop()
        for key in _COUNTS:
            v = node.get(key)
            if key.startswith("max") and isinstance(v, (int, float)) and not isinstance(v, bool) and v > LLAMA_REPETITION_THRESHOLD:
                del node[key]

        def sub(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            if not _STRUCTURAL & value.keys():
                return dict(_ANY)
            copy = dict(value)
            stack.append(copy)
            return copy

        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                node[key] = {k: sub(v) for k, v in node[key].items()}
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                node[key] = [sub(v) for v in node[key]]
        for key in ("items", "additionalProperties", "not", "contains"):
            if isinstance(node.get(key), dict):
                node[key] = sub(node[key])
            elif key == "items" and isinstance(node.get(key), list):
                node[key] = [sub(v) for v in node[key]]
    if not _STRUCTURAL & root.keys() and root:
        return dict(_ANY)
    return root


def check_bounds(text: str) -> None:
    """``InputError`` unless the GBNF ``text`` is within the bounds above: its
    size, how deep its groups nest and its repetition counts, read here before
    llama.cpp's parser sees it (strings, character classes and comments skipped)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InputError(f"the grammar holds {text[exc.start]!r} at character {exc.start}, a lone surrogate: not UTF-8 text") from None
    if size > MAX_GRAMMAR_BYTES:
        raise InputError(f"the grammar is {size // 1024} KiB; at most {MAX_GRAMMAR_BYTES // 1024} KiB is run at every token")
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"[":  # a literal or a character class: to its unescaped end
            end = "\"" if c == "\"" else "]"
            i += 1
            while i < n and text[i] != end:
                i += 2 if text[i] == "\\" else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_GRAMMAR_DEPTH:
                raise InputError(f"the grammar nests groups more than {MAX_GRAMMAR_DEPTH} deep (llama.cpp's parser recurses per group)")
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == "{":
            j = text.find("}", i)
            for part in (text[i + 1:j] if j > i else "").split(","):
                part = part.strip()
                if part.isdigit() and int(part) > MAX_REPEAT:
                    raise InputError(f"the grammar repeats {int(part)} times; at most {MAX_REPEAT} (no reply is that long)")
        i += 1


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
    check_bounds(text)
    if triggers:
        patterns = [p.encode("utf-8") for p in triggers]
        arr = (ctypes.c_char_p * len(patterns))(*patterns)
        sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, text.encode("utf-8"), b"root", arr, len(patterns), None, 0)
    else:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
    if not sampler:
        raise InputError("the grammar does not parse (llama.cpp's GBNF parser refused it: see its grammars/README.md)")
    return sampler


def check(vocab: object, text: str, n_vocab: int | None = None) -> None:
    """Raise ``InputError`` unless ``text`` is within the bounds and llama.cpp
    parses it (``init`` checks both); with ``n_vocab``, also unless filtering
    the whole vocabulary at its first token takes at most ``MAX_STEP_SECONDS``."""
    sampler = init(vocab, text)
    try:
        if n_vocab is not None:
            took = filter_seconds(sampler, n_vocab)
            if took > MAX_STEP_SECONDS:
                # Once more before refusing: the first pass builds llama.cpp's decoded candidates in
                # memory the process may touch for the first time, and the kernel's time for that
                # counts in the thread's CPU (357 ms once in the test suite for a schema that takes 5-16 ms).
                took = min(took, filter_seconds(sampler, n_vocab))
            if took > MAX_STEP_SECONDS:
                raise InputError(too_slow(took))
    finally:
        llama_cpp.llama_sampler_free(sampler)


def too_slow(seconds: float) -> str:
    return (f"the grammar took {1000 * seconds:.0f} ms to filter the vocabulary for one token; at most "
            f"{1000 * MAX_STEP_SECONDS:.0f} ms (every other request waits for it: a long enum or alternation is the usual cause)")


def filter_seconds(sampler: object, n_vocab: int) -> float:
    """How long ``sampler`` (a grammar, in its current state) takes to filter every token of the vocabulary once."""
    cur = np.zeros(n_vocab, dtype=TOKEN_DATA)
    cur["id"] = np.arange(n_vocab, dtype=np.int32)
    arr = llama_cpp.llama_token_data_array(cur.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), n_vocab, -1, False)
    t0 = time.thread_time()  # this thread's CPU: the grammar's own cost, not a busy machine's wait
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
    return time.thread_time() - t0
