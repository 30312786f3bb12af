"""A reply generated on the engine thread, and what it measured.

Redraws cost CPU that the decode threads need (on 2 cores, a 20 fps chat cost
25% of decode speed, measured by scripts/bench_tui.py). So tokens leave the
engine thread in batches (``Batcher``), at most every ``BATCH_NS``; the first
token at once, as it is the TTFT the user waits for. After the reply, its
decode rate is set against this machine's roofline (``ceiling``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from localllm.audio.sound import AudioClip
from localllm.chat.session import ChatSession
from localllm.cockpit.events import ReplyEnded, Tokens
from localllm.cockpit.loading import Footprint
from localllm.cockpit.wording import reason
from localllm.engine_api import GenerationStats
from localllm.measure.doctor import gpu_weights_read_per_token, weights_read_per_token
from localllm.measure.roofline import roofline
from localllm.plan import planner
from localllm.vision.image import RGBImage

BATCH_NS = int(float(os.environ.get("LOCALLLM_TUI_BATCH_MS", "200")) * 1e6)  # the chat's text: five redraws a second


class Batcher:
    """A reply's tokens gathered into ``Tokens`` events, one at most every ``BATCH_NS``
    (the first at once), each handed to ``emit``."""

    def __init__(self, start_ns: int, emit: Callable[[object], None]) -> None:
        self.start_ns, self.emit = start_ns, emit
        self.first_text: int | None = None  # when the first token with text came
        self._pieces: list[str] = []
        self._stamps: list[int] = []
        self._last_post = 0

    def add(self, text: str, t_ns: int) -> None:
        self._pieces.append(text)
        self._stamps.append(t_ns)
        if self.first_text is None and text:
            self.first_text = t_ns
        if t_ns - self._last_post >= BATCH_NS:
            self.flush()
            self._last_post = t_ns

    def flush(self) -> None:
        """Hand over what is gathered (nothing, if nothing is)."""
        if self._pieces:
            self.emit(Tokens("".join(self._pieces), self._stamps, self.start_ns, self.first_text, tuple(self._pieces)))
            self._pieces, self._stamps = [], []


def generate(chat: ChatSession, message: dict[str, str], submitted_ns: int, images: list[RGBImage | AudioClip] | None,
             stop: threading.Event, emit: Callable[[object], None]) -> None:
    """The reply to ``message`` on the engine thread. TTFT runs from Enter
    (``submitted_ns``) to the first token that prints text, on the same clock
    for the live figure and the final stats. What it learns goes to ``emit``
    (``Tokens``, then ``ReplyEnded``): the stats are the generation's own, read
    once it is closed. ``stop`` (Esc, quit) is checked after every token."""
    batch = Batcher(submitted_ns, emit)
    stopped = False
    error = None
    reply = None
    try:
        reply = chat.send_messages([message], start_ns=submitted_ns, images=images or None)
        for event in reply:
            batch.add(event.text, event.t_ns)
            if stop.is_set():
                stopped = True
                break
    except Exception as exc:  # noqa: BLE001 - shown in the chat log; the app goes on
        error = reason(exc)
    finally:
        if reply is not None:
            reply.close()  # ends the generation now and records the turn
    batch.flush()
    stats = reply.stats if reply is not None and error is None else None
    emit(ReplyEnded(stats, stopped, error, reply.spec if reply is not None else None))


def ceiling(s: GenerationStats, fp: Footprint | None, bandwidth: float | None, gpu_bandwidth: float | None, info: Any) -> float | None:
    """This machine's decode roofline for the loaded model at the reply's
    context, or None where it is not known. ``info``: the engine's LoadInfo."""
    # over --rpc, layers are read by the workers' devices at bandwidths we do not know: no roofline
    if not bandwidth or fp is None or fp.placement is not None:
        return None
    kv = planner.kv_bytes_in_use(fp.plan, s.context_used)
    # offloaded layers are read at the GPU's speed; a CPU build (or a
    # --vram plan on a machine without a GPU) offloads nothing
    offloads = bool(info and info.gpu_offload_supported)
    gpu_read = gpu_weights_read_per_token(fp.shape, fp.plan, True) if offloads else 0
    return roofline(
        bandwidth, weights_read_per_token(fp.shape), kv, s.decode_tokens_per_s,
        gpu_bytes=gpu_read, gpu_bandwidth=gpu_bandwidth,
    ).ceiling_tokens_per_s
