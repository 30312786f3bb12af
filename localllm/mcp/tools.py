"""Tools and results as localllm takes them from an MCP server: checked,
bounded, and in the shapes the chat template and the UI want.

A server is untrusted. A tool it lists is left out, with one line saying why,
when its name is not an OpenAI function name (control characters included),
its schema is over ``MAX_SCHEMA_BYTES`` or nested past ``MAX_DEPTH``, or its
``$ref`` points back into itself (no grammar can hold a reply to it); past
``MAX_TOOLS`` a server's list is cut. A result is text: past the byte bound
it is cut with a note saying how much there was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from localllm.util.fmt import safe

NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's function names (serve/tools.py's rule)
MAX_TOOLS = 128  # a chat's tools, all servers together (serve/tools.py's MAX_TOOLS)
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION = 8192  # characters; longer descriptions are cut
MAX_DEPTH = 32
MAX_RESULT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Tool:
    """One tool of one server."""

    server: str
    name: str
    description: str
    schema: dict[str, Any]  # the input schema (JSON Schema, an object)

    def function(self) -> dict[str, Any]:
        """OpenAI's function object, as chat templates and ``serve`` take it."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = self.schema
        return out

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function()}

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "name": self.name, "description": self.description, "input_schema": self.schema}


@dataclass(frozen=True)
class ToolResult:
    """What a call gave: text for the model, and what the UI shows about it."""

    server: str
    tool: str
    text: str  # what the model reads (an error's line when the call failed)
    is_error: bool = False  # the tool reported an error, or the call failed
    failed: bool = False  # no result: the server failed, timed out, or the call was cancelled or denied
    size: int = 0  # bytes of the whole result, before any cut
    truncated: bool = False
    elapsed_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "tool": self.tool, "text": self.text, "is_error": self.is_error, "failed": self.failed,
                "size": self.size, "truncated": self.truncated, "elapsed_ms": round(self.elapsed_ms, 1)}


def check(server: str, name: object, description: object, schema: object) -> tuple[Tool | None, str | None]:
    """(the tool, None) or (None, the line saying why it is left out)."""
    if not isinstance(name, str) or not NAME.match(name):
        return None, f"{server}: a tool named {safe(str(name)[:80])!r} is left out: a name is 1 to 64 letters, digits, '_', '.' or '-'"
    where = f"{server}: tool {name} is left out"
    if not isinstance(schema, dict):
        return None, f"{where}: its input schema is not an object"
    try:
        size = len(json.dumps(schema, ensure_ascii=False))
    except (ValueError, TypeError, RecursionError):
        return None, f"{where}: its input schema is not JSON"
    if size > MAX_SCHEMA_BYTES:
        return None, f"{where}: its input schema is {size // 1024} KiB, over {MAX_SCHEMA_BYTES // 1024} KiB"
    why = _schema_problem(schema)
    if why:
        return None, f"{where}: its input schema {why}"
    text = description if isinstance(description, str) else ""
    return Tool(server, name, text[:MAX_DESCRIPTION], schema), None


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be offered: too deep, or a ``$ref`` cycle."""
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update({f"#/{key}/{k}": v for k, v in schema[key].items()})

    def refs(node: Any, depth: int) -> set[str] | None:  # None: too deep
        if depth > MAX_DEPTH:
            return None
        found: set[str] = set()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            found.add(node["$ref"])
        for child in children:
            sub = refs(child, depth + 1)
            if sub is None:
                return None
            found |= sub
        return found

    top = refs(schema, 0)
    if top is None:
        return f"is nested more than {MAX_DEPTH} levels deep"
    graph = {}
    for ref, body in defs.items():
        sub = refs(body, 0)
        if sub is None:
            return f"is nested more than {MAX_DEPTH} levels deep"
        graph[ref] = sub
    if "#" in top:
        return "refers to itself ($ref \"#\")"
    state: dict[str, int] = {}

    def cyclic(ref: str) -> bool:
        state[ref] = 1
        for nxt in graph.get(ref, ()):
            if nxt == "#" or state.get(nxt) == 1 or (nxt not in state and cyclic(nxt)):
                return True
        state[ref] = 2
        return False

    if any(ref not in state and cyclic(ref) for ref in graph):
        return "refers to itself through $ref (recursive)"
    return None


def offered(tools: Iterable[Tool], *, limit: int = MAX_TOOLS) -> tuple[list[Tool], list[str]]:
    """The tools a chat offers: the first of each name, at most ``limit``; a line per one left out."""
    out: list[Tool] = []
    lines: list[str] = []
    seen: dict[str, str] = {}
    for t in tools:
        if t.name in seen:
            lines.append(f"{t.server}: tool {t.name} is left out: {seen[t.name]} has a tool of that name")
        elif len(out) >= limit:
            lines.append(f"{t.server}: tool {t.name} and the ones after it are left out: a chat offers at most {limit} tools")
            break
        else:
            seen[t.name] = t.server
            out.append(t)
    return out, lines


def result_text(content: Iterable[Any], structured: Any, *, limit: int = MAX_RESULT_BYTES) -> tuple[str, int, bool]:
    """(text, whole size in bytes, cut) of a result's content blocks: text as it
    is, other blocks named with their size; past ``limit`` bytes cut with a note."""
    parts: list[str] = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '') or ''}, {len(str(getattr(block, 'data', '')))} bytes of base64]")
        elif kind == "resource":
            res = getattr(block, "resource", None)
            parts.append(str(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]"))
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{safe(kind)[:40]} content]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return cut("\n".join(parts), limit)


def cut(text: str, limit: int = MAX_RESULT_BYTES) -> tuple[str, int, bool]:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, len(data), False
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[... cut: the result is {len(data)} bytes; the first {limit // 1024} KiB are kept]", len(data), True
