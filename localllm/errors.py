"""Errors the CLI turns into one line on stderr and an exit code.

Exit codes: 0 success, 1 an error in input or environment (a missing or bad model
file, a model that does not fit, llama.cpp refusing to load), 2 a usage error
(bad option value, unknown command), 130 interrupted by Ctrl+C, 143 terminated
(SIGTERM, where a command cleans up first).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports


class LocalLLMError(Exception):
    """An error with a message fit to show the user as-is, and an exit code."""

    exit_code = EXIT_ERROR


class InputError(LocalLLMError):
    """A file or model the user named is missing, unreadable or malformed."""


class UsageError(LocalLLMError):
    """An option value or combination that makes no sense."""

    exit_code = EXIT_USAGE


class EngineError(LocalLLMError):
    """llama.cpp refused to load or to run (its last error line is in the message)."""


class Terminated(LocalLLMError):
    """SIGTERM, turned into an exception where a command must clean up first."""

    exit_code = EXIT_TERMINATED
