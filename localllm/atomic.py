"""Write a file so that a crash leaves the old version or the new one, never half.

Every file localllm writes whole (the registry, saved sessions, prompt-cache
state) goes through here: the bytes go to a uniquely named temporary file
beside the target, are flushed to disk, and ``os.replace`` swaps it in. The
temporary name is unique per call (not just per process), so two threads or
processes writing the same target never share one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(target: Path, data: bytes) -> Path:
    """``data`` to a temporary file beside ``target``, fsync, then ``os.replace``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(name, target)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return target


def write_json(target: Path, data: Any) -> Path:
    """JSON (UTF-8, non-ASCII kept) written atomically."""
    return write_bytes(target, json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8"))
