"""The built-in tools a server was started with (``--tools NAME,NAME`` or
``all``), as llama-server lists and calls them: their definitions (OpenAI
functions, llama-server's words), and a call run on a thread of the toolbox's
own pool (the tools block on files and commands; the server's event loop
must not).

At most ``WORKERS`` calls run at once; the others wait their turn. ``stop()``
(the server is stopping) kills every running command and refuses new calls.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from localllm.server_tools import files, search, shell
from localllm.server_tools.base import Context, ToolError, UnknownTool
from localllm.server_tools.places import io_for

WORKERS = 8


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def _p(kind: str, description: str) -> dict[str, str]:
    return {"type": kind, "description": description}


# name -> (display name, writes, streams, definition), in llama-server's order (build_tools)
TOOLS: dict[str, tuple[str, bool, bool, dict[str, Any]]] = {
    "read_file": ("Read file", False, False, _fn(
        "read_file", "Read the contents of a file. Optionally specify a 1-based line range. "
        "If append_loc is true, each line is prefixed with its line number (e.g. \"1\u2192...\").",
        {"path": _p("string", "Path to the file"), "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
         "end_line": _p("integer", "Last line to read, 1-based inclusive (default: end of file)"),
         "append_loc": _p("boolean", "Prefix each line with its line number")}, ["path"])),
    "file_glob_search": ("File search", False, False, _fn(
        "file_glob_search", "Recursively search for files matching a glob pattern under a directory. "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
        "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
        "A pattern containing '/' matches the full relative path; unless already anchored with "
        "\"**/\" or a leading '/', it is automatically prefixed with \"**/\". "
        "Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. "
        "Note: directory listings do not apply .gitignore filtering.",
        {"path": _p("string", "Base directory to search in"),
         "include": _p("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
         "exclude": _p("string", "Glob pattern for files to exclude"),
         "type": _p("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
         "max_depth": _p("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct children only)"),
         "limit": _p("integer", f"Maximum number of results to return, capped at {search.SEARCH_MAX} (default {search.SEARCH_MAX})")},
        ["path"])),
    "grep_search": ("Grep search", False, False, _fn(
        "grep_search", "Search for a pattern in files under a path. Returns matching lines with file paths "
        "(and, unless searching a single file, paths relative to the given directory). "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
        "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
        "containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).",
        {"path": _p("string", "File or directory to search in"),
         "pattern": _p("string", "Pattern to search for (regular expression unless literal is true)"),
         "include": _p("string", "Glob pattern to filter files (default: **)"), "exclude": _p("string", "Glob pattern to exclude files"),
         "return_line_numbers": _p("boolean", "If true, include line numbers in results"),
         "literal": _p("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
         "ignore_case": _p("boolean", "Case-insensitive search (default: false)"),
         "context_lines": _p("integer", "Number of lines of context to show before and after each match (default: 0)")},
        ["path", "pattern"])),
    "exec_shell_command": ("Execute shell command", True, True, _fn(
        "exec_shell_command", "Execute a shell command and return its output (stdout and stderr combined).",
        {"command": _p("string", "Shell command to execute"),
         "timeout": _p("integer", f"Timeout in seconds (default 10, max {shell.EXEC_MAX_TIMEOUT})"),
         "max_output_size": _p("integer", f"Maximum output size in bytes (default {shell.EXEC_MAX_OUTPUT})")}, ["command"])),
    "write_file": ("Write file", True, False, _fn(
        "write_file", "Write content to a file, creating it (including parent directories) if it does not exist. "
        "May use with edit_file for more complex edits.",
        {"path": _p("string", "Path of the file to write"), "content": _p("string", "Content to write")}, ["path", "content"])),
    "edit_file": ("Edit file", True, False, _fn(
        "edit_file", "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file "
        "and is matched against the original content, not incrementally. Merge nearby changes into "
        "one edit instead of overlapping edits. Use write_file to replace the whole file.",
        {"path": _p("string", "Path to the file to edit"),
         "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                   "items": {"type": "object", "properties": {
                       "old_text": _p("string", "Exact text to find; must be unique in the file and must not overlap with other edits"),
                       "new_text": _p("string", "Text to replace old_text with")}, "required": ["old_text", "new_text"]}}},
        ["path", "edits"])),
    "get_info": ("Get Runtime Info", False, False, _fn(
        "get_info", "Returns runtime info: the OS name/version and the current working directory", {}, None)),
}
NAMES = tuple(TOOLS)


def choose(spec: str) -> tuple[str, ...]:
    """``--tools``'s value (``all``, or names separated by commas) as tool names, in
    llama-server's order; an unknown name is a ``ValueError`` naming the ones there are."""
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    if not wanted:
        raise ValueError(f"--tools needs tool names separated by commas, or all (available tools: {', '.join(NAMES)})")
    unknown = [n for n in wanted if n != "all" and n not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool \"{unknown[0][:64]}\". available tools: {', '.join(NAMES)}")
    return NAMES if "all" in wanted else tuple(n for n in NAMES if n in wanted)


class Toolbox:
    """The chosen built-in tools: listed, and called on the toolbox's threads."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = tuple(n for n in NAMES if n in names)
        self._stop = threading.Event()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._running: set[threading.Event] = set()  # each running call's stop: set by stop(), or by the call's client going

    def listing(self) -> list[dict[str, Any]]:
        """llama-server's tool objects (``server_tool::to_json``)."""
        return [{"display_name": TOOLS[n][0], "tool": n, "type": "builtin", "permissions": {"write": TOOLS[n][1]}, "uses_cwd": True,
                 "definition": TOOLS[n][3]} for n in self.names]

    def check(self, name: str, stream: bool) -> None:
        """``UnknownTool`` unless ``name`` is one of these tools (and streams, when ``stream``)."""
        if name not in self.names:
            raise UnknownTool(f"unknown tool \"{name[:80]}\"")
        if stream and not TOOLS[name][2]:
            raise UnknownTool(f"tool \"{name}\" does not support stream = true")

    def submit(self, name: str, params: dict[str, Any], ctx: Context, push: Callable[[str], bool] | None = None,
               cancel: threading.Event | None = None) -> concurrent.futures.Future[dict[str, Any] | None]:
        """The call, started on a worker thread. ``push``: stream the output through it
        (exec_shell_command; the result is then None). ``cancel`` set: its command is
        killed (the client went away). ``ToolError`` comes out of the future."""
        self.check(name, push is not None)
        with self._lock:
            if self._stop.is_set():
                raise ToolError("the server is stopping")
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="localllm-tool")
            return self._pool.submit(self.call, name, params, ctx, push, cancel)

    def call(self, name: str, params: dict[str, Any], ctx: Context, push: Callable[[str], bool] | None = None,
             cancel: threading.Event | None = None) -> dict[str, Any] | None:
        """One call, here and now (blocking)."""
        self.check(name, push is not None)
        stop = cancel or threading.Event()
        with self._lock:
            if self._stop.is_set():
                stop.set()
            self._running.add(stop)
        try:
            return self._call(name, params, ctx, push, stop)
        finally:
            with self._lock:
                self._running.discard(stop)

    def _call(self, name: str, params: dict[str, Any], ctx: Context, push: Callable[[str], bool] | None,
              stop: threading.Event) -> dict[str, Any] | None:
        io = io_for(ctx, stop)
        if name == "read_file":
            return files.read_file(io, params, ctx.resp_type)
        if name == "write_file":
            return files.write_file(io, params)
        if name == "edit_file":
            return files.edit_file(io, params)
        if name == "file_glob_search":
            return search.file_glob_search(io, params)
        if name == "grep_search":
            return search.grep_search(io, params)
        if name == "get_info":
            return shell.get_info(io, ctx)
        if push is not None:
            shell.exec_streamed(io, params, push)
            return None
        return shell.exec_shell_command(io, params)

    def stop(self) -> None:
        """Kill the running commands (their calls answer with what they had) and refuse new calls."""
        with self._lock:
            self._stop.set()
            for stop in self._running:
                stop.set()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
