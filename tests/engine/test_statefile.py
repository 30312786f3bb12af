"""The KV-cache state file format detects damage before anything is loaded from it."""

from __future__ import annotations

import pytest


def test_state_file_format_detects_damage() -> None:
    from localllm.engine import StateFileError, pack_state, unpack_state

    meta = {"build": "b", "model": {"path": "/m", "size": 1, "mtime_ns": 2}, "cache": {}}
    raw = pack_state(meta, [1, 2, 3], b"payload-bytes")
    assert unpack_state(raw) == (meta, [1, 2, 3], b"payload-bytes")
    damaged = {
        "truncated": raw[: len(raw) // 2],
        "flipped": raw[:-40] + bytes([raw[-40] ^ 1]) + raw[-39:],
        "tampered count": raw.replace(b"[1,2,3]", b"[1,2,9]"),
        "old format": b"GGSQ" + raw[4:],
        "empty": b"",
    }
    for what, bad in damaged.items():
        with pytest.raises(StateFileError):
            unpack_state(bad)
        assert what
