"""One sequence's draftless speculation: the n-gram index over what its context
holds and its reply so far, and the controller that says when to draft. The
engine's generation loop (one sequence) and serve's scheduler (one per slot)
each hold one per reply."""

from __future__ import annotations

from collections.abc import Sequence

from localllm.speculation.control import K_START, Controller
from localllm.speculation.history import Replay, Replies
from localllm.speculation.ngram import NgramIndex

RUN_MIN = 12  # tokens a quote must have run to be drafted on as far whatever the controller says


class Drafting:
    def __init__(self, seen: Sequence[int], mode: str, k_max: int, replies: Replies | None = None) -> None:
        self.index = NgramIndex(seen)
        self.ctl = Controller(mode, k_max=k_max, cold=True)
        self.replay = Replay(replies, seen)

    def finish(self) -> None:
        """The reply is over: it joins the replies later requests draft from."""
        self.replay.finish()

    def seen(self, token: int) -> None:
        """A token of the reply, as it is given."""
        self.index.add(token)
        self.replay.seen(token)
        self.ctl.observed(token)

    def draft(self, *limits: int | None) -> list[int]:
        """The tokens to verify with the next one (none: decode it alone), at most each of
        ``limits`` (None: no limit): the reply's room, the cache's free cells, a step's rows."""
        if self.ctl.mode == "none":
            return []
        want = self.ctl.wants()
        # a quote followed for n tokens already: draft as far (up to k_max) rather than ramp up to it,
        # even while the controller is off (llama.cpp's ngram-mod drafts only such runs: 24 tokens matched);
        # the quote is of this request's text, or of the reply given before to a prompt that ended the same
        run = self.index.run(self.ctl.k_max)
        before = self.replay.run()
        if run >= RUN_MIN or before >= RUN_MIN:
            want = max(want, run, before)
        if not want:
            self.ctl.shadow(self.index.draft(K_START))
            return []
        if want >= self.ctl.k_max // 2:
            # half way there: the whole length, whose rows cost less each (SmolLM2 on 2 CPU cores: 8.0 ms a
            # row up to 63 rows, 5.8 from 64 on, so 65 rows take what 49 do; on a GPU rows are nearly free)
            want = self.ctl.k_max
        want = min([want, *(x for x in limits if x is not None)])
        if before > run:
            return self.replay.draft(want) or self.index.draft(want)
        return self.index.draft(want)
