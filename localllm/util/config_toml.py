"""The config file read as TOML, under bounds: the one reader that the CLI's
defaults (``commands/config_file.py``) and the MCP servers (``localllm.mcp``)
share, so both see the same table and the same one-line errors.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

from localllm.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_CONFIG_BYTES = 1024 * 1024  # a config of every option for every command is a few KB


def read_text(path: Path, *, what: str = "a localllm config file",
              fix: str = "a config file is a TOML text file): remove it or point LOCALLLM_CONFIG elsewhere") -> str | None:
    """The file's text (None when there is none). Only a regular file is read, and
    at most MAX_CONFIG_BYTES of it: a FIFO at the path would block every command,
    a link to /dev/zero would read until memory runs out. ``what`` and ``fix``
    word the errors for other settings files (a llama-server presets INI)."""
    try:
        st = path.stat()  # follows a link: what would be read
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: not a regular file ({fix}")
    try:
        with open(path, "rb") as f:  # a bounded read
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UsageError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB: not {what}")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: unreadable ({exc})") from None


def parse(text: str, path: Path) -> dict[str, Any]:
    """``text`` as TOML; a failure of any kind is one line naming the file (a TOML
    array 1,000 deep made tomllib recurse past Python's limit)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise UsageError(f"{path}: not valid TOML (nested too deep)") from None


def read(path: Path) -> dict[str, Any]:
    """The file's table ({} when there is none)."""
    text = read_text(path)
    return {} if text is None else parse(text, path)
