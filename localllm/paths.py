"""Every filesystem location localllm uses, in one place.

``LOCALLLM_HOME`` overrides the data directory (tests point it at ``tmp_path``).
Nothing here touches the disk at import time; directories are created on use.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """Root of localllm's own state: models it assembled, settings, logs."""
    env = os.environ.get("LOCALLLM_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "localllm"


def models_dir() -> Path:
    """Where model files localllm writes (assembled or downloaded) live."""
    return data_dir() / "models"


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
