"""llama-server's slot files: ``POST /slots/{id}?action=save|restore|erase`` under
``serve --slot-save-path DIR`` (tools/server/server-context.cpp, its
test_slot_save.py): a slot's cached prompt written to a file, and read back
into any slot, so a long conversation reopens without reading it again.

The file is llama.cpp's sequence-state file (``llama_state_seq_save_file`` in
src/llama-context.cpp): magic ``ggsq``, version, the token count, the tokens,
then the sequence's KV state. llama-server restores that layout too (its
"legacy token list"), and ours restores its packed payload where it holds
tokens only (``LLAMA_TOKEN_NULL``, version, count, tokens).

A file name is a bare name (no separator, no leading dot, at most 255 bytes):
nothing is read or written outside DIR. A file read back is untrusted: its
header, its token ids (each in the vocabulary, at most a context's worth) and
its size are checked before llama.cpp sees the state, and a state llama.cpp
refuses leaves the slot empty. A slot busy with a request is not touched (409).
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve.protocol import RequestError, error_body, parse_json
from localllm.util import atomic

MAGIC = 0x67677371  # LLAMA_STATE_SEQ_MAGIC ('ggsq')
VERSION = 2  # LLAMA_STATE_SEQ_VERSION
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: llama-server's packed token payload starts with it
MAX_FILE = 16 * 2**30  # a state file read back: a bound far above any KV cache a laptop holds
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$")


def pack(tokens: list[int], state: bytes | bytearray) -> bytes:
    """llama.cpp's sequence-state file for ``tokens`` and their KV ``state``."""
    return struct.pack(f"=III{len(tokens)}i", MAGIC, VERSION, len(tokens), *tokens) + bytes(state)


def unpack(data: bytes, n_vocab: int, n_ctx: int) -> tuple[list[int], bytes]:
    """(tokens, state) of a sequence-state file, each part checked; ValueError naming what is wrong."""
    if len(data) < 12:
        raise ValueError("is too short to be a slot file")
    magic, version, n = struct.unpack_from("=III", data)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"is not a slot file of this llama.cpp (magic {magic:#x}, version {version}; expected {MAGIC:#x}, {VERSION})")
    if n > n_ctx + 3 or len(data) < 12 + 4 * n:
        raise ValueError(f"claims {n} tokens: a slot holds at most {n_ctx}")
    tokens = list(struct.unpack_from(f"={n}i", data, 12))
    if n >= 3 and tokens[0] == TOKEN_NULL:  # llama-server's packed payload: NULL, its version, the count, the tokens
        count = tokens[2]
        if count != n - 3:
            raise ValueError("holds media or a packed payload this server cannot read")
        tokens = tokens[3:]
    if len(tokens) > n_ctx:
        raise ValueError(f"holds {len(tokens)} tokens: a slot holds at most {n_ctx}")
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ValueError(f"holds token id {bad}, outside this model's vocabulary (0..{n_vocab - 1})")
    return tokens, data[12 + 4 * n:]


def _path(folder: Path, body: dict) -> tuple[str, Path]:
    name = body.get("filename")
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise RequestError(400, "'filename' must be a bare file name (letters, digits, '_', '-', '.'; no folder, at most 255)",
                           param="filename")
    return name, folder / name


def routes(state) -> list[Route]:
    """``POST /slots/{id}``, over ``state`` (``app.ServeState``: its ``slot_save_path`` and scheduler)."""

    async def action(request: Request) -> Response:
        folder: Path | None = state.slot_save_path
        if folder is None:
            return JSONResponse(error_body("This server does not support slots action. Start it with `--slot-save-path`",
                                           kind="not_supported_error"), status_code=501)
        try:
            slot = _slot(request, state)
            what = request.query_params.get("action")
            if what == "erase":
                return JSONResponse(await _engine(state, lambda: _erase(state, slot)))
            if what not in ("save", "restore"):
                raise RequestError(400, "Invalid action: 'action' must be save, restore or erase", param="action")
            name, path = _path(folder, parse_json(await request.body() or b"{}"))
            if what == "save":
                return JSONResponse(await _save(state, slot, name, path))
            return JSONResponse(await _restore(state, slot, name, path))
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)

    return [Route("/slots/{id_slot}", action, methods=["POST"])]


def _slot(request: Request, state):
    raw = request.path_params["id_slot"]
    slots = state.scheduler.slots
    if not raw.isdigit() or int(raw) >= len(slots):
        raise RequestError(400, f"no slot {raw[:20]!r}: this server has slots 0..{len(slots) - 1}", param="id_slot")
    return slots[int(raw)]


async def _engine(state, fn):
    """``fn()`` on the engine thread (the only thread that touches llama.cpp's context)."""
    return await asyncio.wrap_future(state.scheduler.call(fn))


def _idle(slot) -> None:
    if slot.job is not None:
        raise RequestError(409, f"slot {slot.id} is busy with a request: try again when it is done", kind="invalid_request_error")


def _erase(state, slot) -> dict:
    _idle(slot)
    n = len(slot.cache)
    state.scheduler.model.seq_rm(slot.id)
    slot.cache = []
    return {"id_slot": slot.id, "n_erased": n}


async def _save(state, slot, name: str, path: Path) -> dict:
    t0 = time.perf_counter()

    def take() -> tuple[list[int], bytes | bytearray]:
        _idle(slot)
        return list(slot.cache), state.scheduler.model.seq_save(slot.id)

    tokens, kv = await _engine(state, take)
    data = pack(tokens, kv)

    await asyncio.to_thread(atomic.write_bytes, path, data)  # a crash leaves the old file or the new one
    return {"id_slot": slot.id, "filename": name, "n_saved": len(tokens), "n_written": len(data),
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


async def _restore(state, slot, name: str, path: Path) -> dict:
    t0 = time.perf_counter()

    def read() -> bytes:
        if not path.is_file():
            raise RequestError(404, f"no slot file named {name!r} in --slot-save-path", param="filename")
        if path.stat().st_size > MAX_FILE:
            raise RequestError(400, f"{name!r} is over {MAX_FILE // 2**30} GiB: not a slot file of this server", param="filename")
        return path.read_bytes()

    data = await asyncio.to_thread(read)
    try:
        tokens, kv = unpack(data, state.n_vocab, state.n_ctx_seq)
    except ValueError as exc:
        raise RequestError(400, f"{name!r} {exc}", param="filename") from None

    def load() -> None:
        _idle(slot)
        model = state.scheduler.model
        model.seq_rm(slot.id)
        slot.cache = []
        if not model.seq_load(slot.id, kv):
            raise RequestError(400, f"llama.cpp refused the state in {name!r} (another model's, or no room in the cache): the slot is empty",
                               param="filename")
        slot.cache = tokens

    await _engine(state, load)
    return {"id_slot": slot.id, "filename": name, "n_restored": len(tokens), "n_read": len(data),
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
