"""Requests as real clients send them (issue 59, items 1 and 2), kept in
``captured/``: Claude Code 2.1.332's first request of ``claude -p "Say hello"``,
with its tool search on (12 tools, one deferred) and off (22 tools), taken by a
capturing server. Each was a 400 before: a ``system`` message as
``messages[1]``, a property with only a ``description`` (the converter
asserted), ``maxLength`` 524288 (over the repetition bound) and the nesting of
its optional properties (over the depth bound). The limits still refuse a
hostile schema (``tests/serve/test_robust.py`` sends them to a server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.errors import InputError
from localllm.serve import anthropic, tools
from tests.helpers.vocab import grammar_takes

CAPTURED = Path(__file__).parent / "captured"


def _captured(name: str) -> dict:
    return json.loads((CAPTURED / name).read_text(encoding="utf-8"))["body"]


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    from localllm.engine.tokenizer import Tokenizer

    return Tokenizer(smollm2_vocab, None)


@pytest.mark.parametrize("name", ["claude_code_2.1.332_tool_search.json", "claude_code_2.1.332_all_tools.json"])
def test_claude_codes_request_translates_with_its_system_message_in_the_system_prompt(name: str) -> None:
    body = _captured(name)
    assert [m["role"] for m in body["messages"]] == ["user", "system"]  # as Claude Code sends it
    out, ignored = anthropic.translate(body)
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["system", "user"]
    system = out["messages"][0]["content"]
    # the top-level system blocks first, then the system message's text, in order
    assert system.index("You are a Claude agent") < system.index("# Environment")
    assert "cch=" not in system or "cch=fffff;" in system
    assert "context_management" in ignored and "thinking.display" in ignored and "metadata" not in ignored
    names = [t["function"]["name"] for t in out["tools"]]
    assert "DeferredToolPlaceholder" not in names  # defer_loading: true is Anthropic's tool search, not shown to the model
    assert len(names) == len([t for t in body["tools"] if not t.get("defer_loading")])


def test_a_system_message_anywhere_joins_the_system_prompt_at_its_place() -> None:
    body = {"max_tokens": 4, "system": "A.", "messages": [
        {"role": "system", "content": "B."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "system", "content": [{"type": "text", "text": "C."}]}, {"role": "user", "content": "again"}]}
    out, _ = anthropic.translate(body)
    assert out["messages"] == [{"role": "system", "content": "A.\n\nB.\n\nC."}, {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]
    with pytest.raises(Exception, match=r"messages\[0\]\.content\[0\]"):
        anthropic.translate({"max_tokens": 4, "messages": [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "x"}]})
    with pytest.raises(Exception, match=r"'messages\[0\]\.role' must be"):
        anthropic.translate({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]})


@pytest.mark.parametrize("choice", ["auto", "required"])
@pytest.mark.parametrize("fmt", [tools.GENERIC, tools.HERMES], ids=lambda f: f.name)
def test_claude_codes_22_tools_compile_and_llama_cpp_parses_the_grammar(fmt: tools.Format, choice: str, vocab) -> None:
    out, _ = anthropic.translate(_captured("claude_code_2.1.332_all_tools.json"))
    out["tool_choice"] = choice
    req = tools.parse_request(out, fmt)
    assert req is not None and len(req.functions) == 22 and req.grammar
    assert bool(req.triggers) == (choice == "auto")  # auto: lazy, from the format's trigger
    from localllm.engine import grammar

    grammar.check(vocab.vocab, req.grammar, vocab.n_vocab)  # bounds, llama.cpp's parser, the first token's cost


def test_a_description_only_property_is_any_json_value_as_llama_cpp_decides(vocab) -> None:
    """common/json-schema.cpp: no type and no structural keyword is ``common_chat_schema_any``."""
    from localllm.engine import grammar

    schema = {"type": "object", "properties": {"x": {"description": "anything at all"}}, "required": ["x"]}
    gbnf = grammar.from_json_schema(schema)
    for value in ('1', '"s"', '{"a": [true, null]}', '[1, "b"]', 'null'):
        assert grammar_takes(vocab, gbnf, '{"x": ' + value + '}'), value
    assert not grammar_takes(vocab, gbnf, '{"y": 1}')
    # the schema given is left as it was
    assert schema["properties"]["x"] == {"description": "anything at all"}


def test_an_upper_bound_llama_cpp_ignores_is_dropped_a_lower_one_past_the_bound_refused(vocab) -> None:
    """src/llama-grammar.cpp reads {m,n} with n over MAX_REPETITION_THRESHOLD (2000) as {m,}: a
    ``maxLength`` of 524288 binds nothing, so it compiles as an unbounded string, not 524288 rules."""
    from localllm.engine import grammar

    gbnf = grammar.from_json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 524288}}, "required": ["s"]})
    assert "524288" not in gbnf and len(gbnf) < 2000
    assert grammar_takes(vocab, gbnf, '{"s": "' + "ab " * 300 + '"}')
    bounded = grammar.from_json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]})
    assert grammar_takes(vocab, bounded, '{"s": "abc"}') and not grammar_takes(vocab, bounded, '{"s": "abcd"}')
    with pytest.raises(InputError, match="minLength is 30000000"):
        grammar.from_json_schema({"type": "string", "minLength": 30_000_000})


def test_a_hundred_tools_of_claude_codes_size_compile(vocab) -> None:
    """Many tools are alternatives of one rule, not nesting: 100 tools (Claude Code's 22, then copies
    under other names) make one grammar that llama.cpp parses, lazy under auto."""
    out, _ = anthropic.translate(_captured("claude_code_2.1.332_all_tools.json"))
    base = out["tools"]
    many = [{"type": "function", "function": {**t["function"], "name": f"{t['function']['name']}_{i}"}}
            for i in range(5) for t in base][:100]
    req = tools.parse_request({"tools": many, "tool_choice": "auto"}, tools.HERMES)
    assert req is not None and len(req.functions) == 100 and req.triggers
    from localllm.engine import grammar

    grammar.check(vocab.vocab, req.grammar, vocab.n_vocab)
