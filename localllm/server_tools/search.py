"""``file_glob_search`` and ``grep_search``, answering as llama-server's: the
same text (``Total matches: N``, the limit lines), ``entries`` and ``base``
for the web UI's picker, the same glob rules (a pattern with no ``/`` matches
a basename at any depth; one with ``/`` the whole relative path, ``**/``
put in front unless it starts with ``**`` or ``/``), and git's list of files
where the folder is in a work tree (ignored files left out).

The glob is matched by walking the pattern's states over the name at once
(time the product of both lengths), not by backtracking: ``**a**a**a**b``
cannot make it take for ever. The grep's regular expression is the model's,
and Python's ``re`` does backtrack, so it runs in a process of its own that
is killed at its deadline (``grep_worker``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from localllm.server_tools import grep_worker, proc
from localllm.server_tools.base import optional_bool, optional_int, optional_str, path_param, required_str
from localllm.server_tools.places import READ_MAX, Io, Isolate

SEARCH_MAX = 100  # llama-server's SERVER_TOOL_FILE_SEARCH_MAX_RESULTS and SERVER_TOOL_GREP_SEARCH_MAX_RESULTS
GREP_TIMEOUT_S = 30.0
MAX_PATTERN = 4096
MAX_CONTEXT = 100  # context lines each side of a match
ISOLATE_READ_BUDGET = 256 * 1024 * 1024  # the most grep reads through an isolate in one call


def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's ``glob_match`` (common/common.cpp): ``*`` any run without ``/``, ``**``
    any run, ``?`` one character but ``/``, ``[...]`` a class (``!`` negates, ``a-z`` ranges)."""
    tokens = _tokens(pattern)
    states = _closure({0}, tokens)
    for c in text:
        nxt = set()
        for k in states:
            if k == len(tokens):
                continue
            kind, arg = tokens[k]
            if kind == "**" or (kind == "*" and c != "/"):
                nxt.add(k)
            elif (kind == "lit" and c == arg) or (kind == "?" and c != "/") or (kind == "[" and _in_class(c, arg)):
                nxt.add(k + 1)
        states = _closure(nxt, tokens)
        if not states:
            return False
    return len(tokens) in states


def _tokens(pattern: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(("**", ""))
            i += 2
        elif c in "*?":
            out.append((c, ""))
            i += 1
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] in "]-":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:
                out.append(("[", pattern[i + 1:j]))
                i = j + 1
            else:  # no closing bracket: a literal '['
                out.append(("lit", "["))
                i += 1
        else:
            out.append(("lit", c))
            i += 1
    return out


def _closure(states: set[int], tokens: list[tuple[str, str]]) -> set[int]:
    out, todo = set(states), list(states)
    while todo:
        k = todo.pop()
        if k < len(tokens) and tokens[k][0] in ("*", "**") and k + 1 not in out:
            out.add(k + 1)
            todo.append(k + 1)
    return out


def _in_class(c: str, body: str) -> bool:
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    if body[:1] in ("]", "-"):
        if body[0] == c:
            return not negated
        body = body[1:]
    i, hit = 0, False
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            if body[i] <= c <= body[i + 2]:
                hit = True
                break
            i += 3
        else:
            if body[i] == c:
                hit = True
                break
            i += 1
    return hit != negated


def path_glob_match(pattern: str, rel: str) -> bool:
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


def file_glob_search(io: Io, params: dict[str, Any]) -> dict[str, Any]:
    path = path_param(params)
    base = io.resolve(path)
    include = optional_str(params, "include", "**")
    exclude = optional_str(params, "exclude", "")
    kind = optional_str(params, "type", "file")
    depth = max(0, optional_int(params, "max_depth", 0))
    asked = optional_int(params, "limit", SEARCH_MAX)
    if asked < 1:
        return {"error": f"invalid limit: {asked} (expected 1 or more)"}
    limit = min(asked, SEARCH_MAX)
    if kind not in ("file", "dir", "all"):
        return {"error": f"invalid type: {kind} (expected \"file\", \"dir\" or \"all\")"}
    listing = io.list(base, depth, kind)
    if listing.error:
        return {"error": f"{listing.error}: {path}"}
    matches = [(rel, is_dir) for rel, is_dir in listing.entries
               if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
    shown = matches[:limit]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob pattern to narrow the search.]\n"
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    return {"plain_text_response": text, "entries": [{"path": rel, "type": "dir" if d else "file"} for rel, d in shown], "base": base}


def grep_search(io: Io, params: dict[str, Any]) -> dict[str, Any]:
    path = path_param(params)
    source = required_str(params, "pattern", limit=MAX_PATTERN)
    include = optional_str(params, "include", "**")
    exclude = optional_str(params, "exclude", "")
    numbers = optional_bool(params, "return_line_numbers")
    ctx = min(MAX_CONTEXT, max(0, optional_int(params, "context_lines", 0)))
    if optional_bool(params, "literal"):
        source = re.escape(source)
    flags = re.IGNORECASE if optional_bool(params, "ignore_case") else 0
    try:
        re.compile(source, flags)  # compiling is bounded by the pattern's length; matching is what may not be
    except (re.error, RecursionError, OverflowError) as exc:
        return {"error": f"invalid regex: {exc}"}
    full = io.resolve(path)
    files: list[dict[str, Any]] = []
    if io.is_file(full):
        files.append({"path": full, "show": path})
    elif io.is_dir(full):
        listing = io.list(full, 0, "file")
        if listing.error:
            return {"error": f"{listing.error}: {path}"}
        for rel, _ in listing.entries:
            if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel)):
                files.append({"path": os.path.join(full, rel) if not isinstance(io, Isolate) else f"{full.rstrip('/')}/{rel}", "show": rel})
    else:
        return {"error": f"path does not exist: {path}"}
    if isinstance(io, Isolate):  # the worker cannot read inside the isolate: the files travel to it
        budget = ISOLATE_READ_BUDGET
        for f in files:
            data = io.read(f["path"], min(READ_MAX, budget)) if budget > 0 else None
            budget -= len(data or b"")
            f["text"] = data.decode("utf-8", errors="replace") if data is not None else ""
    job = {"pattern": source, "flags": int(flags), "ctx": ctx, "num": numbers, "max": SEARCH_MAX, "files": files}
    res = proc.run([sys.executable, "-I", grep_worker.__file__], stdin=json.dumps(job).encode(), max_output=16 * grep_worker.OUT_MAX,
                   timeout=GREP_TIMEOUT_S, combine_stderr=False, stop=io.stop)
    if res.timed_out:
        return {"error": f"grep_search took longer than {GREP_TIMEOUT_S:g} s (a pattern that backtracks, or too many files): "
                         "narrow the path, the include or the pattern"}
    try:
        found = json.loads(res.data)
    except ValueError:
        return {"error": f"grep_search failed (its search process ended with status {res.exit_code})"}
    text = found["text"] + f"\n---\nTotal matches: {found['total']}\n"
    if found["limit"]:
        text += f"[{SEARCH_MAX} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}
