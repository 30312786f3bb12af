"""Tool calling for ``localllm serve``: OpenAI's ``tools``/``tool_choice`` in,
``tool_calls`` out, in the format the model's chat template speaks.

Which format, and how a reply is parsed, is ``localllm.toolcalls``'s (the
families llama.cpp's common/chat.cpp reads: Hermes, Llama 3, Mistral,
Qwen3-Coder, gpt-oss, DeepSeek, Kimi K2, GLM, ...; ``generic`` for any other
template: the tools are described in a system message and the reply is
``{"name", "arguments"}``, as llama-server's generic format does). This
module is the OpenAI side: the request's tools checked, the grammar a call
is held to, the messages as the template gets them, the calls in OpenAI's shape.

``tool_choice`` ``required`` or a named function holds the reply to a
grammar of a valid call from its first token; ``auto`` leaves it free until
the format's marker appears, then holds it (llama.cpp's lazy grammar);
``none`` shows the model no tools. The formats whose arguments are XML-ish
parameters (Qwen3-Coder, GLM, MiniMax, Seed-OSS, LFM2) have no grammar here:
``auto`` is free text, and a forced call is held to the generic JSON object,
which their parsers also read. Pure Python but for the schema converter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from localllm.reasoning import Markers
from localllm.toolcalls import GENERIC, HERMES, LLAMA3, MISTRAL, Call, Format, Stream, collect, detect

__all__ = ["GENERIC", "HERMES", "LLAMA3", "MAX_TOOLS", "MISTRAL", "NAME", "Format", "ReplySplitter", "ToolRequest", "ToolsError",
           "detect", "for_template", "message_extras", "parse_reply", "parse_request", "split_reply", "thinking_first"]

MAX_TOOLS = 128
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's function names
_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")


class ToolsError(Exception):
    """A bad ``tools``/``tool_choice``/message value: the field and why (a 400)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' {why}")
        self.field, self.why = field, why


@dataclass(frozen=True)
class ToolRequest:
    """A request's validated tools and what follows from them."""

    functions: tuple[dict[str, Any], ...]  # {"name", "description"?, "parameters"} of each tool offered
    choice: str  # "auto", "required" or "function"
    grammar: str | None  # GBNF of the reply: valid calls only; None: free (``auto`` where the format has no grammar here)
    triggers: tuple[str, ...]  # empty: the grammar holds from the first token; else lazy (tool_choice "auto")
    fmt: Format

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """What the chat template gets as ``tools`` (None where a system message describes them)."""
        return [{"type": "function", "function": f} for f in self.functions] if self.fmt.native else None


def parse_request(body: dict, fmt: Format) -> ToolRequest | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``; None when no tool
    can be called (none offered, or ``tool_choice`` ``none``)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolsError("parallel_tool_calls", "must be true or false")
    functions = _functions(raw)
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolsError("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
        named = fn["name"]
        if named not in {f["name"] for f in functions}:
            raise ToolsError("tool_choice", f"names the function {named[:64]!r}, which is not among 'tools'")
        choice = "function"
    elif choice is None:
        choice = "auto"
    elif choice not in ("auto", "none", "required"):
        raise ToolsError("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
    if choice == "none" or not functions:
        if choice in ("required", "function"):
            raise ToolsError("tool_choice", f"is {choice!r} but no 'tools' are given")
        return None
    called = [f for f in functions if named is None or f["name"] == named]
    reading = replace(fmt, schemas={f["name"]: f["parameters"] for f in functions})  # the parser types XML-ish values by these
    if fmt.json_fallback:  # no grammar of its own: auto is free text; a forced call is the generic JSON object, read as well
        if choice == "auto":
            _call_rules(called, GENERIC)  # the schemas are checked all the same
            return ToolRequest(functions=functions, choice=choice, grammar=None, fmt=reading, triggers=())
        return ToolRequest(functions=functions, choice=choice, grammar=GENERIC.root_one + _call_rules(called, GENERIC),
                           fmt=replace(reading, bare="{"), triggers=())
    many = parallel is not False and fmt.parallel and fmt.root_many != fmt.root_one and choice != "function"
    root = fmt.root_many if many else fmt.root_one
    return ToolRequest(functions=functions, choice=choice, grammar=root + _call_rules(called, fmt), fmt=reading,
                       triggers=(fmt.trigger,) if choice == "auto" else ())


def _functions(raw: object) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise ToolsError("tools", f"must be a list of at most {MAX_TOOLS} tools")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ToolsError(f"tools[{i}]", 'must be {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolsError(f"tools[{i}].function.name", "must be 1 to 64 letters, digits, '_', '.' or '-'")
        if any(f["name"] == name for f in out):
            raise ToolsError(f"tools[{i}].function.name", f"repeats {name!r}")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolsError(f"tools[{i}].function.description", "must be a string")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}  # OpenAI: omitted means no parameters
        if not isinstance(params, dict):
            raise ToolsError(f"tools[{i}].function.parameters", "must be a JSON schema object")
        out.append({"name": name, **({"description": desc} if desc else {}), "parameters": params})
    return tuple(out)


def _call_rules(functions: list[dict[str, Any]], fmt: Format) -> str:
    """GBNF rule ``tool-call``: one call object of one of ``functions``. The
    object around the arguments is written here, with room for the newlines
    and indents models put in it (the lazy grammar's trigger may already hold
    them); each function's arguments by llama-cpp-python's JSON-schema
    converter, all in one schema (``anyOf``) so their rule names do not clash
    (with each other, or with ours: root and tool-*)."""
    from localllm.engine import grammar  # lazy: loads llama.cpp's grammar converter, asked only when a request offers tools
    from localllm.errors import InputError

    try:  # anyOf even for one: every rule of the arguments is then named alternative-N-..., apart from ours
        gbnf = grammar.from_json_schema({"anyOf": [f["parameters"] for f in functions]})
    except InputError as exc:
        for i, f in enumerate(functions):  # which one: each alone (the request is refused anyway)
            try:
                grammar.from_json_schema(f["parameters"])
            except InputError:
                raise ToolsError(f"tools[{i}].function.parameters", str(exc)) from None
        raise ToolsError("tools", str(exc)) from None
    root = re.search(r"^root ::= (.*)$", gbnf, re.M)
    assert root is not None  # the converter always writes its root rule
    refs = root.group(1).split(" | ")  # one rule an alternative, in order
    gbnf = gbnf.replace(root.group(0) + "\n", "", 1)
    if fmt.call_gbnf:  # the name in the format's markup, the arguments JSON
        alts = " | ".join("(" + fmt.call_gbnf.replace("@NAME@", f["name"]).replace("@ARGS@", ref) + ")" for f, ref in zip(functions, refs))
        return f"tool-call ::= {alts}\n" + gbnf
    alts = " | ".join(f'"\\"{f["name"]}\\"" tool-ws "," tool-ws "\\"{fmt.args_key}\\"" tool-ws ":" tool-ws {ref}'
                      for f, ref in zip(functions, refs))
    return (f'tool-call ::= "{{" tool-ws "\\"name\\"" tool-ws ":" tool-ws ({alts}) tool-ws "}}"\n'
            "tool-ws ::= [ \\t\\n]{0,8}\n" + gbnf)


def thinking_first(grammar: str, marks: Markers) -> str:
    """A forced call's grammar (``tool_choice`` required or named) for a prompt
    that opened the thinking: DeepSeek R1's and QwQ's templates, and others with
    ``enable_thinking``, end the generation prompt inside ``<think>``, so the
    reply is thinking first. Held to the call from its first token, the call
    would be written inside the thinking and read as thinking. As llama.cpp's
    grammar for such a prompt (common/chat-auto-parser-generator.cpp: the
    reasoning parser before the calls, from where the generation prompt left
    it), the reply is held to text without the closing marker, the marker, then
    the calls; the split knows the thinking was open (``Splitter(started_open)``)."""
    root = re.search(r"^root ::= ", grammar, re.M)
    assert root is not None  # every format's grammar is rooted at root
    close = marks.close
    text = " | ".join([f"[^{_char(close[0])}]"] + [f"{_lit(close[:k])} [^{_char(close[k])}]" for k in range(1, len(close))])
    return (f"root ::= thinking {_lit(close)} [ \\t\\r\\n]{{0,4}} tool-root\nthinking ::= ({text})*\n"
            + grammar[:root.start()] + "tool-root ::= " + grammar[root.end():])


def _lit(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _char(c: str) -> str:
    """``c`` inside a GBNF character class."""
    return "\\" + c if c in "]^-\\" else c


# -- messages ------------------------------------------------------------------------

def message_extras(m: dict, i: int) -> dict[str, Any]:
    """An assistant message's ``tool_calls`` and ``reasoning_content`` and a tool
    message's ``tool_call_id``, validated, as chat templates read them (Transformers'
    shape: a call's ``arguments`` an object where the JSON string holds one)."""
    extras: dict[str, Any] = {}
    calls = m.get("tool_calls")
    if calls is not None and m.get("role") == "assistant":
        if not isinstance(calls, list):
            raise ToolsError(f"messages[{i}].tool_calls", "must be a list")
        out = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            where = f"messages[{i}].tool_calls[{j}]"
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", "{}"), str):
                raise ToolsError(where, 'must be {"id", "type": "function", "function": {"name": ..., "arguments": "JSON text"}}')
            try:
                args: Any = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = fn["arguments"]  # not JSON: the template gets the text as it is
            cid = c.get("id")
            out.append({"id": cid if isinstance(cid, str) else "", "type": "function", "function": {"name": fn["name"], "arguments": args}})
        if out:
            extras["tool_calls"] = out
    thought = m.get("reasoning_content")
    if thought is not None and m.get("role") == "assistant":  # an earlier turn's thinking, as llama-server reads it: the template may show it
        if not isinstance(thought, str):
            raise ToolsError(f"messages[{i}].reasoning_content", "must be a string")
        if thought:
            extras["reasoning_content"] = thought
    if m.get("role") == "tool":
        cid = m.get("tool_call_id")
        if not isinstance(cid, str):
            raise ToolsError(f"messages[{i}].tool_call_id", "must be the id of the call this message answers")
        extras["tool_call_id"] = cid
    if isinstance(m.get("name"), str):
        extras["name"] = m["name"]
    return extras


def for_template(messages: list[dict[str, Any]], fmt: Format, req: ToolRequest | None) -> list[dict[str, Any]]:
    """The messages as the template gets them. A native format renders calls
    and results itself; the generic one gets calls as the JSON the model
    writes, results as user messages, and the tools in a system message (or
    the first user message, where the template refuses a system one)."""
    if fmt.native:
        return messages
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool" and out and out[-1].get("results"):  # results in a row: one turn (templates that alternate roles)
            out[-1]["content"] += "\n" + _result(m)
        elif m.get("tool_calls"):
            text = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
                             for c in m["tool_calls"])
            out.append({"role": "assistant", "content": ((m["content"] + "\n") if m["content"] else "") + text})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": _result(m), "results": True})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    out = [{"role": m["role"], "content": m["content"]} for m in out]
    if req is None:
        return out
    said = ("You can call these functions. To call one, reply with only a JSON object "
            '{"name": <function name>, "arguments": <arguments object>} and nothing else.\n\n'
            + "\n".join(json.dumps(f, ensure_ascii=False) for f in req.functions))
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + said}, *out[1:]]
    if not fmt.system_role:  # said at the start of the first user message instead
        first = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if first is not None:
            return [*out[:first], {"role": "user", "content": said + "\n\n" + out[first]["content"]}, *out[first + 1:]]
    return [{"role": "system", "content": said}, *out]


def _result(m: dict[str, Any]) -> str:
    return json.dumps({"tool_response": {"tool_call_id": m["tool_call_id"], "content": m["content"]}}, ensure_ascii=False)


# -- replies -------------------------------------------------------------------------

def parse_reply(text: str, fmt: Format, names: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of a reply: calls in OpenAI's shape, content what is left.
    A reply whose calls do not all parse, or name a function not offered, is
    all content (no calls), as llama-server leaves it."""
    return split_reply(text, fmt, names)[1:]


def split_reply(text: str, fmt: Format, names: set[str]) -> tuple[str | None, str, list[dict[str, Any]]]:
    """(reasoning, content, calls): ``parse_reply`` with the thinking a format
    writes in its own markup (gpt-oss's analysis channel), which
    ``parse_reply`` leaves out; a reply left all content keeps it in its text."""
    s = Stream(fmt)
    parsed = collect(s.feed(text) + s.finish(), s)
    content, calls = _openai(text, parsed, fmt, names)
    return (parsed.reasoning if content is not text else None), content, calls


def _openai(text: str, parsed: Any, fmt: Format, names: set[str]) -> tuple[str, list[dict[str, Any]]]:
    if parsed.broken and parsed.calls or any(c.name not in names for c in parsed.calls):
        return text, []
    return parsed.content, [_call(c, fmt) for c in parsed.calls]


def _call(c: Call, fmt: Format) -> dict[str, Any]:
    """A parsed call as OpenAI's ``tool_calls`` item: the model's own id where
    it wrote a usable one (Kimi's, Mistral's), else a new one."""
    ok = c.id is not None and _ID.match(c.id) and (not fmt.id_len or (len(c.id) == fmt.id_len and c.id.isalnum()))
    return {"id": c.id if ok else fmt.call_id(), "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}


class ReplySplitter:
    """Streams the content of a reply that may hold calls: text that cannot
    begin a call goes out at once; from where a call may begin it is held,
    and ``finish`` gives the calls (all at the end: a reply whose calls do
    not all parse is all content, which only its end can tell)."""

    def __init__(self, req: ToolRequest) -> None:
        self.req = req
        self.text = ""
        self.sent = ""
        self.stream = Stream(req.fmt)
        self.parts: list[Any] = []

    def feed(self, piece: str) -> str:
        """Add a piece of the reply; the content now safe to send ("" for none)."""
        self.text += piece
        got = self.stream.feed(piece)
        self.parts += got
        if self.req.choice != "auto" or any(isinstance(p, Call) for p in self.parts):
            return ""  # the grammar makes the whole reply calls; or calls came: what follows waits for the verdict
        out = "".join(p[1] for p in got if not isinstance(p, Call) and p[0] == "content")
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content not yet sent, calls) once the reply is whole."""
        self.parts += self.stream.finish()
        content, calls = _openai(self.text, collect(self.parts, self.stream), self.req.fmt, {f["name"] for f in self.req.functions})
        if not calls and not self.stream.called:
            return content[len(self.sent):] if content.startswith(self.sent) else "", []
        rest = content[len(self.sent):] if content.startswith(self.sent) else ""
        return rest, calls
