"""Tool calling for ``localllm serve``: OpenAI's ``tools``/``tool_choice`` in,
``tool_calls`` out, in the format the model's chat template speaks.

A model calls a tool by writing text its template taught it; which text is
read from the template (as llama-server's common/chat.cpp does):

- ``hermes`` (Qwen 2.5, Hermes): ``<tool_call>{"name", "arguments"}</tool_call>``;
- ``llama3`` (Llama 3.1, 3.2): the reply is ``{"name", "parameters"}``;
- ``mistral`` (Mistral v0.3, Nemo): ``[TOOL_CALLS][{"name", "arguments"}, ...]``;
- ``generic``: any other template (SmolLM2, Gemma, Phi-3.5 have no tool
  calling): the tools are described in a system message and the reply is
  ``{"name", "arguments"}``, as llama-server's generic format does.

``tool_choice`` ``required`` or a named function holds the reply to a
grammar of a valid call from its first token; ``auto`` leaves it free until
the format's marker appears, then holds it (llama.cpp's lazy grammar);
``none`` shows the model no tools. Pure Python but for the schema converter.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, replace
from typing import Any

MAX_TOOLS = 128
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's function names
_ALNUM = string.ascii_letters + string.digits


class ToolsError(Exception):
    """A bad ``tools``/``tool_choice``/message value: the field and why (a 400)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' {why}")
        self.field, self.why = field, why


@dataclass(frozen=True)
class Format:
    """How one template family writes a call: the grammar's top rule around a
    call object, the lazy grammar's trigger, and the keys of a call."""

    name: str
    args_key: str  # "arguments", or Llama 3's "parameters"
    root_one: str  # GBNF of the whole reply holding one call (rule tool-call is one call object)
    root_many: str  # ... holding one or more calls
    trigger: str  # a regex ending in $ over the reply so far; its capture is where the grammar starts (tool_choice "auto")
    id_len: int = 0  # Mistral's templates want 9 alphanumerics as a call id; 0: OpenAI's call_...
    system_role: bool = True  # generic: whether the template takes a system message (Gemma 2's refuses one)

    def call_id(self) -> str:
        if self.id_len:
            return "".join(secrets.choice(_ALNUM) for _ in range(self.id_len))
        return "call_" + secrets.token_hex(12)

    @property
    def native(self) -> bool:
        """Whether the chat template renders the tools itself (else a system message says them)."""
        return self.name != "generic"


# The lazy grammar's triggers: each ends at the end of the reply so far ($), so
# llama.cpp replays into the grammar only the capture, text it accepts. None
# holds an unbounded run: llama.cpp tries them after every token on all the
# reply so far (std::regex, which recurses per character of such a run).
_JSON_START = r'^[ \t\n]{0,16}(\{[ \t\n]{0,8}"name"[ \t\n]{0,8}:[ \t\n]{0,8}"?)$'
_HERMES_BLOCK = 'tool-block ::= "<tool_call>" [ \\n]{0,2} tool-call [ \\n]{0,2} "</tool_call>"\n'
HERMES = Format("hermes", "arguments", "root ::= tool-block\n" + _HERMES_BLOCK,
                'root ::= tool-block ("\\n" tool-block)*\n' + _HERMES_BLOCK, r'(<tool_call>[ \n]{0,2}(?:\{[ \t\n]{0,8}"?)?)$')
LLAMA3 = Format("llama3", "parameters", "root ::= tool-call\n", "root ::= tool-call\n", r"^(?:<\|python_tag\|>)?" + _JSON_START[1:])
MISTRAL = Format("mistral", "arguments", 'root ::= "[TOOL_CALLS]" "[" tool-call "]"\n',
                 'root ::= "[TOOL_CALLS]" "[" tool-call ("," " "? tool-call)* "]"\n', r'(\[TOOL_CALLS\](?:\[(?:\{[ \t\n]{0,8}"?)?)?)$', id_len=9)
GENERIC = Format("generic", "arguments", "root ::= tool-call\n", "root ::= tool-call\n", _JSON_START)


def detect(template: str | None) -> Format:
    """The call format a chat template's text teaches (``generic`` when none)."""
    if not template:
        return GENERIC
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if "<|start_header_id|>" in template and "tools" in template and "ipython" in template:
        return LLAMA3
    if "System role not supported" in template:
        return replace(GENERIC, system_role=False)
    return GENERIC


@dataclass(frozen=True)
class ToolRequest:
    """A request's validated tools and what follows from them."""

    functions: tuple[dict[str, Any], ...]  # {"name", "description"?, "parameters"} of each tool offered
    choice: str  # "auto", "required" or "function"
    grammar: str  # GBNF of the reply: valid calls only
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
    root = fmt.root_many if parallel is not False and fmt.root_many != fmt.root_one and choice != "function" else fmt.root_one
    return ToolRequest(functions=functions, choice=choice, grammar=root + _call_rules(called, fmt), fmt=fmt,
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
    alts = " | ".join(f'"\\"{f["name"]}\\"" tool-ws "," tool-ws "\\"{fmt.args_key}\\"" tool-ws ":" tool-ws {ref}'
                      for f, ref in zip(functions, refs))
    return (f'tool-call ::= "{{" tool-ws "\\"name\\"" tool-ws ":" tool-ws ({alts}) tool-ws "}}"\n'
            "tool-ws ::= [ \\t\\n]{0,8}\n" + gbnf)


# -- messages ------------------------------------------------------------------------

def message_extras(m: dict, i: int) -> dict[str, Any]:
    """An assistant message's ``tool_calls`` and a tool message's
    ``tool_call_id``, validated, as chat templates read them (Transformers'
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
    calls: list[tuple[str, Any]] = []
    content = text
    stripped = text.strip()
    if fmt is HERMES:
        blocks = list(re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S))
        if blocks:
            for b in blocks:
                call = _call(b.group(1), "arguments")
                if call is None:
                    return text, []
                calls.append(call)
            content = text[:blocks[0].start()] + text[blocks[-1].end():]
            if "<tool_call>" in content:  # a block left open: cut short
                return text, []
        else:
            call = _call(stripped, "arguments")  # <tool_call> a control token in this vocabulary: not in the text
            if call is not None:
                calls, content = [call], ""
    elif fmt is MISTRAL:
        body = stripped.removeprefix("[TOOL_CALLS]").strip()  # the control token is not in the text; its letters may be
        try:
            items = json.loads(body, strict=False) if body.startswith("[") else None
        except ValueError:
            items = None
        if isinstance(items, list) and items:
            for it in items:
                call = _call(json.dumps(it), "arguments")
                if call is None:
                    return text, []
                calls.append(call)
            content = ""
    else:  # llama3 (after <|python_tag|>, a control token not in the text, or none) and generic: the reply is the call
        stripped = stripped.removeprefix("<|python_tag|>") if fmt is LLAMA3 else stripped
        call = _call(stripped, fmt.args_key) or _call(stripped, "arguments")
        if call is not None:
            calls, content = [call], ""
    if any(name not in names for name, _ in calls):
        return text, []
    return content, [{"id": fmt.call_id(), "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}} for name, args in calls]


def _call(text: str, args_key: str) -> tuple[str, Any] | None:
    try:
        obj = json.loads(text, strict=False)  # the grammar's strings, as llama.cpp's converter writes them, allow control characters
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get(args_key, {}), dict):
        return None
    if set(obj) - {"name", args_key}:
        return None
    return obj["name"], obj.get(args_key, {})


class ReplySplitter:
    """Streams the content of a reply that may hold calls: text that cannot
    begin a call goes out at once; from where a call may begin it is held,
    and ``finish`` parses the whole reply."""

    def __init__(self, req: ToolRequest) -> None:
        self.req = req
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str:
        """Add a piece of the reply; the content now safe to send ("" for none)."""
        self.text += piece
        if self.req.choice != "auto":
            return ""  # the grammar makes the whole reply calls
        end = self._hold_from()
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def _hold_from(self) -> int:
        t = self.text
        if self.req.fmt is HERMES:
            at = t.find("<tool_call>")
            if at >= 0:
                return at
            for k in range(min(len("<tool_call>") - 1, len(t)), 0, -1):
                if "<tool_call>".startswith(t[-k:]):
                    return len(t) - k
            return len(t)
        s = t.lstrip()  # the JSON formats: a call is the whole reply, so the first character decides
        if not s or s[0] in "{[":
            return 0
        return len(t)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content not yet sent, calls) once the reply is whole."""
        content, calls = parse_reply(self.text, self.req.fmt, {f["name"] for f in self.req.functions})
        if not calls:
            return self.text[self.sent:], []
        done = self.text[:self.sent]
        rest = content[len(done):] if content.startswith(done) else ""
        return rest, calls
