"""The KV cache of one sequence, and the token mirror that says what it holds.

llama.cpp does not tell which tokens sit in its cache, so every change to the
cache (prefill, decode, truncation, a context shift, a state file) goes through
this class, which keeps ``tokens`` equal to the cache cell by cell.
Nothing outside it writes the mirror.

An image's cells hold ``IMAGE_FILLER`` in the mirror, and the class keeps where
each image lies: under M-RoPE (Qwen2-VL, Qwen2.5-VL) an image of nx x ny cells
takes max(nx, ny) positions, not nx * ny (libmtmd's mtmd_image_tokens_get_n_pos),
so the text after it sits at a position other than its cell index, as
llama-server's ``server_tokens::pos_next`` counts. ``pos`` maps a cell index to
its position; every decode and removal after such an image uses it.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from localllm.engine.model import ModelHandle
from localllm.engine.native import system_info
from localllm.engine.statefile import StateFileError, pack_state, unpack_state
from localllm.engine_api.errors import ContextFull
from localllm.engine_api.stats import ShiftRecord
from localllm.errors import EngineError, UsageError
from localllm.util import atomic

IMAGE_FILLER = 0  # what the token mirror holds at an image's cells (never compared with text: chat compares rendered text)


class KVCache:
    """Sequence 0 of a ``ModelHandle``'s context, with its tokens."""

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self._tokens: list[int] = []
        self._images: list[tuple[int, int, int]] = []  # (first cell, cells, positions) of each image in the cache
        self.state_error: str | None = None  # why the last load_state refused its file

    @property
    def tokens(self) -> list[int]:
        """A copy of the cached tokens (the mirror itself stays private)."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def pos(self, n: int | None = None) -> int:
        """The position of cell ``n`` (default: the next one): ``n`` itself unless an
        image before it takes fewer positions than cells (M-RoPE)."""
        n = len(self._tokens) if n is None else n
        return n + sum(p - c for s, c, p in self._images if s + c <= n)

    def record_image(self, n_cells: int, n_pos: int) -> None:
        """Note an image the caller decoded after what the cache holds (engine.mtmd)."""
        self._images.append((len(self._tokens), n_cells, n_pos))
        self._tokens.extend([IMAGE_FILLER] * n_cells)

    @property
    def can_shift(self) -> bool:
        """Whether llama.cpp can shift this cache (not a sliding-window cache
        smaller than the context, not a recurrent model)."""
        self.handle.require()
        return bool(llama_cpp.llama_memory_can_shift(self.handle.memory))

    def reset(self) -> None:
        """Forget the conversation: an empty KV cache."""
        self.handle.require()
        llama_cpp.llama_memory_clear(self.handle.memory, True)
        self._tokens = []
        self._images = []

    def truncate(self, n: int) -> None:
        """Drop everything after the first ``n`` cached tokens (rejected draft tokens)."""
        self.handle.require()
        if n < len(self._tokens):
            # an image is kept whole or dropped whole: an M-RoPE image's cells share one position
            n = next((s for s, c, p in self._images if s < n < s + c and p != c), n)
            llama_cpp.llama_memory_seq_rm(self.handle.memory, 0, self.pos(n), -1)
            self._tokens = self._tokens[:n]
            self._images = [im for im in self._images if im[0] < n]

    def append(self, tokens: Sequence[int]) -> int:
        """Evaluate ``tokens`` after what the cache holds, in prompt-sized chunks
        (no room is made: the caller checked). Returns nanoseconds."""
        ns = 0
        for chunk in self.handle.prompt_chunks(list(tokens)):
            at = self.pos()  # llama.cpp would place the chunk after the last position it holds: wrong after an M-RoPE image
            ns += self.handle.decode(chunk, None if at == len(self._tokens) else at)
            self._tokens.extend(chunk)
        return ns

    def record(self, tokens: Sequence[int]) -> None:
        """Note tokens the caller evaluated itself (one batch, e.g. a verify)."""
        self._tokens.extend(tokens)

    def prefill(self, tokens: Sequence[int]) -> float:
        """Evaluate ``tokens`` into the cache after what it holds, generating
        nothing (a system prompt to save). Returns the milliseconds it took."""
        self.handle.require()
        n_ctx = self.handle.n_ctx
        if len(self._tokens) + len(tokens) > n_ctx:
            raise UsageError(f"{len(tokens)} tokens do not fit the context of {n_ctx} with {len(self._tokens)} already in it")
        return self.append(tokens) / 1e6

    def make_room(self, n_new: int, n_keep: int, shifts: list[ShiftRecord]) -> None:
        """Context shift: drop the oldest half of what follows the first ``n_keep``
        tokens (llama.cpp's seq_rm + seq_add, no re-evaluation); where the cache
        cannot shift, re-evaluate the kept window instead."""
        n_ctx = self.handle.n_ctx
        while len(self._tokens) + n_new > n_ctx:
            n_past = len(self._tokens)
            n_left = n_past - n_keep
            if n_left <= 0 or n_keep + n_new > n_ctx:
                raise ContextFull(f"the context ({n_ctx}) is full of kept tokens ({n_keep}): raise {{n_ctx}} or shorten the system prompt")
            n_discard = min(n_left, max(n_left // 2, n_new))
            kept = self._tokens[:n_keep] + self._tokens[n_keep + n_discard :]
            t0 = time.perf_counter_ns()
            mem = self.handle.memory
            if llama_cpp.llama_memory_can_shift(mem):  # never an M-RoPE cache (get_can_shift): its images' positions are their cells
                llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
                llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard)
                self._tokens = kept
                self._images = [(s if s < n_keep else s - n_discard, c, p) for s, c, p in self._images
                                if s + c <= n_keep or s >= n_keep + n_discard]  # one cut in two is gone as a whole
                method = "shift"
            elif self._images:  # the kept window would be read again, and its pictures are not tokens
                raise ContextFull(f"the context ({n_ctx}) is full, and this model cannot shift a cache that holds images: "
                                  "raise {n_ctx}, or start a new conversation")
            else:
                self.reset()
                self.append(kept)
                method = "reprocess"
            shifts.append(ShiftRecord(at_token=n_past, dropped=n_discard, kept=len(kept), ms=(time.perf_counter_ns() - t0) / 1e6, method=method))

    # -- state files -----------------------------------------------------------------
    def save_state(self, path: Path) -> int:
        """Write the cache (sequence 0) and its tokens to ``path`` atomically, in
        localllm's checked format (``statefile``); returns bytes written."""
        self.handle.require()
        ctx = self.handle.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * max(size, 1))()
        n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        if not n:
            raise EngineError(f"llama.cpp could not save the cache to {path}")
        data = pack_state({**self._state_meta(), "images": [list(im) for im in self._images]}, self._tokens, bytes(buf)[:n])

        atomic.write_bytes(path, data)
        return len(data)

    def _state_meta(self) -> dict[str, object]:
        """What a state file must match to be loaded here: this llama.cpp build,
        the model file, the cache layout."""
        import hashlib

        info = self.handle.info
        st = info.path.stat()
        return {
            "build": f"llama-cpp-python {llama_cpp.__version__}; " + hashlib.sha256(system_info().encode()).hexdigest()[:16],
            "model": {"path": str(info.path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
            "cache": {"type_k": info.type_k, "type_v": info.type_v, "flash_attn": info.flash_attn},
        }

    def load_state(self, path: Path) -> bool:
        """Replace the cache with one saved by ``save_state``. False (and an
        empty cache) when the file fails a check, with the reason in
        ``state_error``: llama.cpp never reads a file that is not exactly what
        this build wrote for this model and context."""
        self.reset()
        self.state_error = None
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            self.state_error = f"unreadable ({exc.strerror or exc})"
            return False
        try:
            meta, tokens, payload = unpack_state(raw)
        except StateFileError as exc:
            self.state_error = str(exc)
            return False
        want = self._state_meta()
        for key, what in (("build", "another llama.cpp build"), ("model", "another model file"), ("cache", "other cache settings")):
            if meta.get(key) != want[key]:
                self.state_error = f"written for {what}"
                return False
        n_vocab = self.handle.n_vocab
        if len(tokens) > self.handle.n_ctx or any(not 0 <= t < n_vocab for t in tokens):
            self.state_error = "holds tokens that do not fit this context"
            return False
        images = _images(meta.get("images", []), len(tokens))
        if images is None:
            self.state_error = "holds image spans that do not fit its tokens"
            return False
        buf = (ctypes.c_uint8 * max(len(payload), 1)).from_buffer_copy(payload or b"\0")
        if not llama_cpp.llama_state_seq_set_data(self.handle.ctx, buf, len(payload), 0):
            self.reset()
            self.state_error = "refused by llama.cpp"
            return False
        self._tokens = list(tokens)
        self._images = images
        return True


def _images(value: object, n_tokens: int) -> list[tuple[int, int, int]] | None:
    """A state file's image spans, checked (the file is outside input): in order,
    apart, within its tokens, never more positions than cells. None if not."""
    if not isinstance(value, list):
        return None
    out: list[tuple[int, int, int]] = []
    end = 0
    for im in value:
        if not (isinstance(im, list) and len(im) == 3 and all(type(x) is int for x in im)):
            return None
        s, c, p = im
        if s < end or c < 1 or not 1 <= p <= c or s + c > n_tokens:
            return None
        out.append((s, c, p))
        end = s + c
    return out
