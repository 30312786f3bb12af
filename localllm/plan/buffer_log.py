"""llama.cpp's allocation lines, parsed in one place.

llama.cpp logs every buffer it allocates as "<buffer type> <kind> buffer size =
<MiB> MiB" with two decimals: model weights (src/llama-model.cpp), KV cache
(src/llama-kv-cache.cpp), recurrent state (src/llama-memory-recurrent.cpp),
compute and output (src/llama-context.cpp). The post-load check (``memcheck``),
the per-device check (``placement.logged_buffers``) and the dry run all read
them through ``buffer_lines``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def buffer_lines(lines: Iterable[str | tuple[int, str]]) -> list[tuple[str, str, float]]:
    """(buffer type, kind, MiB as printed) for each allocation line, in log
    order; ``lines`` may be text or the engine's (level, text) pairs."""
    out = []
    for item in lines:
        m = _LINE.search(item[1] if isinstance(item, tuple) else item)
        if m:
            out.append((m.group(1), m.group(2), float(m.group(3))))
    return out
