"""The prompt-cache state file format, in pure Python (no llama.cpp call).

Layout: magic, format version (u32), metadata length (u32), metadata (JSON:
build, model, cache, tokens, payload length), llama.cpp's sequence state
(payload), and a SHA-256 of everything before it. A file is used only when the
magic, version, lengths and checksum hold and the metadata matches: llama.cpp
itself trusts whatever bytes it is given.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence

STATE_MAGIC = b"LOCALLLM-KV\0"
STATE_VERSION = 1
_MAX_META = 64 * 1024 * 1024


class StateFileError(Exception):
    """A state file that fails a check (the message says which)."""


def pack_state(meta: dict[str, object], tokens: Sequence[int], payload: bytes) -> bytes:
    body = json.dumps({**meta, "tokens": list(tokens), "payload_bytes": len(payload)}, separators=(",", ":")).encode()
    head = STATE_MAGIC + struct.pack("<II", STATE_VERSION, len(body)) + body + payload
    return head + hashlib.sha256(head).digest()


def unpack_state(raw: bytes) -> tuple[dict[str, object], list[int], bytes]:
    fixed = len(STATE_MAGIC) + 8
    if len(raw) < fixed + 32 or not raw.startswith(STATE_MAGIC):
        raise StateFileError("not a localllm prompt cache (an older format, or another file)")
    version, meta_len = struct.unpack_from("<II", raw, len(STATE_MAGIC))
    if version != STATE_VERSION:
        raise StateFileError(f"format version {version}, this localllm reads {STATE_VERSION}")
    if meta_len > _MAX_META or fixed + meta_len + 32 > len(raw):
        raise StateFileError("damaged (its lengths do not add up)")
    if hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
        raise StateFileError("damaged (checksum mismatch)")
    try:
        meta = json.loads(raw[fixed : fixed + meta_len])
        tokens = meta.pop("tokens")
        n_payload = meta.pop("payload_bytes")
        if not isinstance(meta, dict) or not isinstance(tokens, list) or not all(type(t) is int for t in tokens) or type(n_payload) is not int:
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StateFileError("damaged (unreadable metadata)") from None
    if fixed + meta_len + n_payload + 32 != len(raw):
        raise StateFileError("damaged (its length is not what its header says)")
    return meta, tokens, raw[fixed + meta_len : -32]
