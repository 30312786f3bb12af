"""``read_file``, ``write_file`` and ``edit_file``, answering as llama-server's
(tools/server/server-tools.cpp): the same fields, the same error lines, and
edit_file's fuzzy match (trailing blanks, smart quotes, dashes and odd spaces
compared as their ASCII; the lines an edit does not touch are kept byte for
byte).

Bounds: a read answers at most 16 KiB of text (``[output truncated]`` past it;
a larger file needs a line range, as llama-server asks) and reads at most 32
MiB of any file, which is also the most an edit rewrites (a larger file is
refused, never cut short by a partial read written back). Only regular files
are read: a FIFO or a device could block or never end.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from localllm.server_tools.base import BadParams, optional_bool, optional_int, path_param, required_str
from localllm.server_tools.places import READ_MAX, Io

READ_TEXT_MAX = 16 * 1024  # llama-server's SERVER_TOOL_READ_FILE_MAX_SIZE
ARROW = "\u2192".encode()
MAX_EDITS = 1000


def read_file(io: Io, params: dict[str, Any], resp_type: str | None) -> dict[str, Any]:
    path = path_param(params)
    start = optional_int(params, "start_line", 1)
    end = optional_int(params, "end_line", -1)
    numbered = optional_bool(params, "append_loc")
    size = io.size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if resp_type == "base64":
        if size > READ_MAX:
            return {"error": f"file too large ({size} bytes, max {READ_MAX})"}
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
    if size > READ_TEXT_MAX and end == -1:
        return {"error": f"file too large ({size} bytes, max {READ_TEXT_MAX}). Use start_line/end_line to read a portion."}
    data = io.read(path)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    out = bytearray()
    stopped = False
    for n, line in enumerate(_lines(data), start=1):
        if n < start:
            continue
        if end != -1 and n > end:
            stopped = True
            break
        piece = (str(n).encode() + ARROW if numbered else b"") + line + b"\n"
        if len(out) + len(piece) > READ_TEXT_MAX:
            out += b"[output truncated]"
            stopped = True
            break
        out += piece
    if not stopped and size > READ_MAX:
        out += b"[output truncated: only the file's first 32 MiB were read]"
    return {"plain_text_response": out.decode("utf-8", errors="replace")}


def write_file(io: Io, params: dict[str, Any]) -> dict[str, Any]:
    path = path_param(params)
    data = required_str(params, "content").encode("utf-8", errors="replace")
    if not io.write(path, data):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


def edit_file(io: Io, params: dict[str, Any]) -> dict[str, Any]:
    path = path_param(params)
    raw = params.get("edits")
    if "edits" not in params:
        raise BadParams("'edits' is required: an array of {old_text, new_text}", param="edits")
    if not isinstance(raw, list) or not raw:
        return {"error": "\"edits\" must be a non-empty array"}
    if len(raw) > MAX_EDITS:
        return {"error": f"\"edits\" holds more than {MAX_EDITS} edits: split them over several calls"}
    edits: list[tuple[str, str]] = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise BadParams(f"edits[{i}] must be an object with old_text and new_text", param="edits")
        old, new = required_str(e, "old_text"), required_str(e, "new_text")
        if not old:
            return {"error": f"edits[{i}].old_text must not be empty"}
        edits.append((old, new))
    size = io.size(path)
    if size is not None and size > READ_MAX:
        return {"error": f"file too large to edit ({size} bytes, max {READ_MAX}): use write_file"}
    data = io.read(path) if size is not None else None
    if data is None:
        return {"error": f"failed to open file: {path}"}
    original = data.decode("utf-8", errors="surrogateescape")  # bytes that are not UTF-8 come back as they were
    done = _apply(original, edits, path)
    if isinstance(done, dict):
        return done
    if done == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    if not io.write(path, done.encode("utf-8", errors="surrogateescape")):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


def _lines(data: bytes) -> list[bytes]:
    """``std::getline``'s lines: split at ``\\n``, no empty last line for a final newline."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _apply(original: str, edits: list[tuple[str, str]], path: str) -> str | dict[str, Any]:
    fuzzy = False
    norm_original = normalize(original)
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in norm_original:
            return {"error": f"could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"}
        fuzzy = True
    base = norm_original if fuzzy else original
    matched: list[tuple[int, int, int, str]] = []  # (where in base, length, edit's index, new text)
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if fuzzy else old
        count = _count(norm_original, normalize(old))  # whitespace-only duplicates count too
        if count > 1:
            return {"error": f"found {count} occurrences of edits[{i}].old_text in {path}, it must be unique"}
        at = base.find(needle)
        if at < 0:
            return {"error": f"could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"}
        matched.append((at, len(needle), i, new))
    matched.sort()
    for a, b in zip(matched, matched[1:]):
        if a[0] + a[1] > b[0]:
            return {"error": f"edits[{a[2]}] and edits[{b[2]}] overlap in {path}; merge them into one edit or target disjoint regions"}
    return _keeping_lines(original, base, matched) if fuzzy else _replace(base, matched, 0)


_SPACES = re.compile("[\u00a0\u2002-\u200a\u202f\u205f\u3000]")
_TABLE = str.maketrans({**dict.fromkeys("\u2018\u2019\u201a\u201b", "'"), **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
                        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-")})


def normalize(text: str) -> str:
    """Each line without its trailing blanks, its typographic quotes, dashes and spaces as ASCII
    (line count and order kept: llama-server's normalize_for_fuzzy_match)."""
    return "\n".join(_SPACES.sub(" ", line.rstrip(" \t\r").translate(_TABLE)) for line in text.split("\n"))


def _count(text: str, needle: str) -> int:
    return text.count(needle) if needle else 0  # str.count counts without overlaps, as llama-server does


def _replace(text: str, reps: list[tuple[int, int, int, str]], offset: int) -> str:
    for at, length, _, new in reversed(reps):
        i = at - offset
        text = text[:i] + new + text[i + length:]
    return text


def _keeping_lines(original: str, base: str, reps: list[tuple[int, int, int, str]]) -> str:
    """The fuzzy edits applied to ``base`` (normalized) line group by line group; every
    line no edit touches comes from ``original``, unnormalized."""
    orig_lines = _split_keep(original)
    spans, offset = [], 0
    for line in _split_keep(base):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    groups: list[list[Any]] = []  # [start line, end line (exclusive), reps]
    for rep in reps:
        start_at, end_at = rep[0], rep[0] + rep[1]
        first = next((i for i, (s, e) in enumerate(spans) if s <= start_at < e), 0)
        last = first
        while last < len(spans) and spans[last][1] < end_at:
            last += 1
        last = min(last, len(spans) - 1) + 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last)
            groups[-1][2].append(rep)
        else:
            groups.append([first, last, [rep]])
    out, kept = [], 0
    for first, last, group in groups:
        out += orig_lines[kept:first]
        lo, hi = spans[first][0], spans[last - 1][1]
        out.append(_replace(base[lo:hi], group, lo))
        kept = last
    out += orig_lines[kept:]
    return "".join(out)


def _split_keep(text: str) -> list[str]:
    """Lines with their ``\\n`` (only ``\\n``: ``str.splitlines`` would also split at ``\\r`` and others)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out
