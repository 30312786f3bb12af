"""What the engine thread tells the cockpit about a reply in flight: its text in
batches (``TokenBatch``, at most every ``BATCH_NS``) and its end (``ReplyDone``).
Apart from app.py so that the tool loop (tools.py), which app.py mixes in,
posts the same messages without importing app.py.

Redraws cost CPU that the decode threads need (on 2 cores, a 20 fps chat cost
25% of decode speed, measured by scripts/bench_tui.py). So tokens reach the
screen in batches.
"""

from __future__ import annotations

import os

from textual.message import Message

from localllm.engine_api import GenerationStats

BATCH_NS = int(float(os.environ.get("LOCALLLM_TUI_BATCH_MS", "200")) * 1e6)  # text redraws: 5 a second


class TokenBatch(Message):
    def __init__(self, text: str, stamps: list[int], start_ns: int, first_text_ns: int | None, pieces: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.text, self.stamps, self.start_ns = text, stamps, start_ns
        self.pieces = pieces  # each token's text, for the <think> clock
        self.first_text_ns = first_text_ns  # the first token that printed text: TTFT's end


class ReplyDone(Message):
    """The engine thread's last word on a reply: the generation's own stats (None
    after an error), whether Esc stopped it, and the error."""

    def __init__(self, stats: GenerationStats | None, stopped: bool, error: str | None) -> None:
        super().__init__()
        self.stats, self.stopped, self.error = stats, stopped, error
