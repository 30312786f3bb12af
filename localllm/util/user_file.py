"""A file a user hands in by path (a picture, a sound clip): its bytes, bounded,
or one line that names the file and the cause.

Pictures and clips are read the same careful way, so it is written once: the
path is looked at before it is opened (a folder, a FIFO or a device would fail
oddly, block or never end, so it is never opened), its size is checked against
the limit before any byte is read, and at most one byte past the limit is read
in case it grew meanwhile (the decoder then names the limit).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localllm.errors import InputError


def read_user_file(path: str | os.PathLike[str], *, kind: str, give: str, max_bytes: int, limit_for: str) -> tuple[Path, bytes]:
    """``path`` expanded, and at most ``max_bytes`` + 1 of its bytes. ``kind`` opens
    every message ("image", "audio"); ``give`` says what to give instead of a
    pipe or device ("a picture file"), ``limit_for`` what the limit is for."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{kind} {p}: no such file") from None
    except PermissionError:
        raise InputError(f"{kind} {p}: permission denied (a folder on the way cannot be read)") from None
    except OSError as exc:
        raise InputError(f"{kind} {p}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{kind} {p} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{kind} {p} is not a regular file (a pipe, socket or device): give {give}")
    if st.st_size > max_bytes:
        raise InputError(f"{kind} {p} is {st.st_size / 2**20:.0f} MiB, over the {max_bytes // 2**20} MiB limit for {limit_for}")
    try:
        with open(p, "rb") as f:
            return p, f.read(max_bytes + 1)
    except PermissionError:
        raise InputError(f"{kind} {p}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{kind} {p}: cannot be read ({exc.strerror or exc})") from None
