"""When to draft, and how long: per sequence, from how often its drafts were right
and what a batch costs here.

A verified batch that is rejected at once costs more than the one token it
gives, so drafting pays only above some acceptance, and only where a batch of
rows costs little more than one row: decoding bound by memory bandwidth (a
model larger than the CPU's caches, a GPU). A small model on a CPU is bound by
compute instead, and there a batch of five rows costs nearly five tokens
(SmolLM2 135M on 2 cores: 53 ms against 14). ``auto`` (the default) tracks the
acceptance of the last drafts and the tokens per second its batches gave
against one-token decodes, both measured on this sequence; below ``OFF_BELOW``,
or slower than decoding alone, it stops drafting, and keeps scoring the drafts
it would have made against the tokens the model then gives (free: no batch),
drafting again once they would have been right often enough (``ON_ABOVE``) to
beat one-token decoding at the batch cost it measured. The draft length grows
while whole drafts are taken, halves when none is, and is twice the tokens kept when some are, as llama.cpp's
``--draft-min``/``--draft-max`` bound it. ``lookup`` always drafts; ``none`` never.
A sequence's drafting (``drafting.Drafting``) starts ``auto`` cold: off, scoring
its shadow drafts, until they would have been kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MODES = ("auto", "lookup", "none")
# The longest draft: a context loaded for speculation outputs K_MAX + 1 rows of logits (n_vocab floats each).
# 64, as llama-server's ngram-mod (common.h: n_max 64): a batch's rows cost less each the more there are
# (SmolLM2 Q4_K_M on 2 cores: 17 rows 145 ms, 8.5 ms a row, against 14 ms for one token), so a quote or
# a loop taken whole pays most in long drafts; at 16, quoting gave x1.41, at 64 x1.64 (docs/benchmarks.md).
K_MAX = 64
# serve's per slot: its rows are n_seq times a slot's (4 slots of Gemma 3's 262k vocabulary at 65 rows
# would hold 272 MiB of logits), and one slot's long draft lengthens every other slot's step
K_MAX_SERVING = 16
K_START = 4
WINDOW = 32  # drafted tokens the acceptance is judged on
OFF_BELOW = 0.35
ON_ABOVE = 0.5


@dataclass
class Controller:
    mode: str = "auto"
    k_max: int = K_MAX
    # auto starts off, scoring the drafts it would make, and drafts once they would have been kept:
    # before anything is measured a draft from a 2-token match costs a batch (on 2 CPU cores the first
    # drafts of a quoting reply kept 13 tokens for 413 ms, against 195 ms one at a time)
    cold: bool = False
    k: int = K_START
    on: bool = True
    drafted: int = 0  # tokens drafted and verified
    accepted: int = 0  # of those, kept
    batches: int = 0  # verify batches
    off_switches: int = 0  # times auto turned drafting off
    _recent: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) of recent drafts, verified or shadow
    _shadow: list[int] = field(default_factory=list)  # a draft not verified: scored against the tokens that come
    _shadow_len: int = 0
    single_ns: float | None = None  # a one-token decode's time here (moving average); None: not measured yet
    _spent: list[tuple[int, int]] = field(default_factory=list)  # (tokens given, ns) of recent verify batches
    _cost: dict[int, float] = field(default_factory=dict)  # rows -> a batch's time over one token's (moving average)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(MODES)}")
        self.on = self.mode == "lookup" or self.mode == "auto" and not self.cold
        self.k = min(self.k, self.k_max)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def wants(self) -> int:
        """How many tokens to draft now (0: decode one token)."""
        return self.k if self.on and self.mode != "none" else 0

    def single(self, ns: int) -> None:
        """A one-token decode took ``ns``."""
        self.single_ns = ns if self.single_ns is None else 0.8 * self.single_ns + 0.2 * ns

    def verified(self, drafted: int, accepted: int, ns: int | None = None) -> None:
        """A draft of ``drafted`` tokens was checked, in a batch that took ``ns``: ``accepted`` of them kept."""
        if not drafted:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.batches += 1
        if ns is not None:
            self._spent.append((accepted + 1, ns))
            while sum(t for t, _ in self._spent) > WINDOW and len(self._spent) > 1:
                self._spent.pop(0)
            if self.single_ns:
                old = self._cost.get(drafted + 1)
                ratio = ns / self.single_ns
                self._cost[drafted + 1] = ratio if old is None else 0.7 * old + 0.3 * ratio
        if accepted == drafted:
            self.k = min(self.k_max, 2 * max(self.k, drafted))  # a quote goes on: draft further (than any longer draft it was given)
        elif accepted == 0:
            self.k = max(1, self.k // 2)
        else:  # a quote broken off: the next as long again as the run kept (a long draft's rows are paid for whole)
            self.k = max(min(K_START, self.k), min(self.k, 2 * accepted))
        self._note(drafted, accepted)
        if self.mode == "auto" and self.on and (self._rate() is not None and self._rate() < OFF_BELOW or self._slower()):  # type: ignore[operator]
            self.on = False
            self.off_switches += 1
            self._recent.clear()
            self._spent.clear()

    def _slower(self) -> bool:
        """Whether the recent batches gave fewer tokens a second than one-token decodes do."""
        given, ns = sum(t for t, _ in self._spent), sum(n for _, n in self._spent)
        if self.single_ns is None or given < WINDOW // 2 or ns <= 0:
            return False
        return given / ns < 1 / self.single_ns

    def _pays(self, rate: float) -> bool:
        """Whether drafts kept at ``rate`` would beat one-token decoding at the batch cost measured here
        (unmeasured: assumed to, as where decoding is bound by memory bandwidth)."""
        rows = K_START + 1
        cost = self._cost.get(rows) or next((c * rows / r for r, c in sorted(self._cost.items(), reverse=True)), None)
        return cost is None or (rate * K_START + 1) / cost > 1.05

    def shadow(self, draft: list[int]) -> None:
        """While off: the draft it would have made now, scored against the tokens that come next."""
        if not self.on and self.mode == "auto" and not self._shadow and draft:
            self._shadow, self._shadow_len = list(draft), len(draft)

    def observed(self, token: int) -> None:
        """A token the model gave (while off, scoring the shadow draft as a verify would have)."""
        if not self._shadow:
            return
        if self._shadow[0] == token:
            self._shadow.pop(0)
            if not self._shadow:
                self._score(self._shadow_len, self._shadow_len)
            return
        self._score(self._shadow_len, self._shadow_len - len(self._shadow))

    def _score(self, drafted: int, accepted: int) -> None:
        self._shadow = []
        self._note(drafted, accepted)
        rate = self._rate()
        if rate is not None and rate >= ON_ABOVE and self._pays(rate):
            self.on = True
            self.k = K_START if self.k_max >= K_START else self.k_max
            self._recent.clear()

    def _note(self, drafted: int, accepted: int) -> None:
        self._recent.append((drafted, accepted))
        while sum(d for d, _ in self._recent) > WINDOW and len(self._recent) > 1:
            self._recent.pop(0)

    def _rate(self) -> float | None:
        d = sum(d for d, _ in self._recent)
        a = sum(a for _, a in self._recent)
        if d < WINDOW // 2 and not (d >= K_START + K_START // 2 and a == 0):
            return None  # too few drafts to judge (unless none of the first two drafts was kept)
        return a / d


def rows(mode: str, *, serving: bool = False) -> int | None:
    """Rows of logits a sequence needs for ``mode``'s drafts (a load's ``n_outputs``, per slot
    for serve); None: one, no drafts."""
    return None if mode == "none" else (K_MAX_SERVING if serving else K_MAX) + 1


def line(drafted: int, accepted: int) -> str:
    """The count as the CLI and the cockpit say it."""
    if not drafted:
        return "nothing drafted"
    return f"{accepted} of {drafted} drafted tokens kept ({100 * accepted / drafted:.0f}%)"


def verify(draft: list[int], draw: Callable[[int], int]) -> list[int]:
    """The tokens a verified draft gives: ``draw(row)`` samples the model at row
    ``row`` of the batch (the current token, then each draft token), once per
    position and in order, as decoding one token at a time would; a draft token
    is kept while it is that sample, and the first sample that differs (or the
    one after a draft kept whole) ends the list. So the tokens are the ones
    sampling without a draft gives, given the same logits."""
    out = []
    for row, d in enumerate(draft):
        picked = draw(row)
        out.append(picked)
        if picked != d:
            return out
    out.append(draw(len(draft)))
    return out
