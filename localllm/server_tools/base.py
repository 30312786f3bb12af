"""What every built-in tool shares: the request's context (the headers'
working directory and runtime), the errors that become an HTTP status, and
reading the model's parameters as llama-server reads them.

A tool's ``params`` come from the model (or whoever can reach the API): every
value is checked. A required one missing or of the wrong type is a 400 (as
llama-server's ``params.at(key).get<T>()`` throws into its 400); an optional
one of the wrong type falls back to its default (its ``json_value``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_PATH = 4096  # PATH_MAX: a longer path names nothing, and would only travel through every helper
MAX_TEXT = 64 * 1024 * 1024  # a string param (write_file's content): the body's own bound is smaller, this is the tool's


class ToolError(Exception):
    """A call refused before the tool ran: ``status`` is the HTTP status of the answer."""

    status = 500
    kind = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class BadParams(ToolError):
    """A required parameter missing or of the wrong type (llama-server's 400)."""

    status = 400
    kind = "invalid_request_error"


class UnknownTool(ToolError):
    """No such tool, or one that cannot stream (llama-server's 404)."""

    status = 404
    kind = "invalid_request_error"


class RuntimeRefused(ToolError):
    """The ``x-tool-runtime`` header names no runtime that may be used (llama-server's 500:
    a tool never falls back to the host when an isolate was asked for)."""


@dataclass(frozen=True)
class Context:
    """Where a call runs: ``cwd`` (``x-tool-cwd``; None: the server's own), ``runtime``
    (``x-tool-runtime``; None: the host), ``resp_type`` (``x-resp-type``: ``base64``
    makes read_file answer the raw bytes). Only headers set these, never the model."""

    cwd: str | None = None
    runtime: str | None = None
    resp_type: str | None = None


def required_str(params: dict[str, Any], key: str, *, limit: int = MAX_TEXT) -> str:
    value = params.get(key)
    if not isinstance(value, str):
        raise BadParams(f"'{key}' is required: a string" if value is None else f"'{key}' must be a string", param=key)
    if len(value) > limit:
        raise BadParams(f"'{key}' is longer than {limit} characters", param=key)
    return value


def optional_str(params: dict[str, Any], key: str, default: str, *, limit: int = MAX_PATH) -> str:
    value = params.get(key)
    return value if isinstance(value, str) and len(value) <= limit else default


def optional_int(params: dict[str, Any], key: str, default: int) -> int:
    """An integer (a float is truncated, as JSON numbers convert in llama-server); anything else: ``default``."""
    value = params.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 2**31:
        return default
    return int(value)


def optional_bool(params: dict[str, Any], key: str, default: bool = False) -> bool:
    value = params.get(key)
    return value if isinstance(value, bool) else default


def path_param(params: dict[str, Any], key: str = "path") -> str:
    """A path the model gives: a string, not empty, bounded, no NUL (which no file name holds)."""
    value = required_str(params, key, limit=MAX_PATH)
    if "\x00" in value:
        raise BadParams(f"'{key}' holds a NUL character: not a path", param=key)
    return value
