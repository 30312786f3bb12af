"""Which thread count the next decode step runs with, chosen from measured step times.

llama.cpp waits at a barrier after every op for its slowest thread, so one core
taken by another process slows every token: with one core of two busy, llama-bench
ran 70 t/s on 1 thread and 40 on 2 (issue 50), while on the idle machine 2 threads
ran 1.3-1.4x faster than 1. No fixed count wins both, so the count is measured as
the decode goes: now and then one step runs at a neighbouring count (one fewer or
one more thread); if it is faster than the recent steps at the current count by a
margin, a second step confirms it and the count moves. A probe of a worse count
costs one slow step.

Exploring is kept cheap on an idle machine (the target: at most 3% of tokens/s
against the best fixed count): a probe that loses doubles the wait before the
next one in that direction, up to about a second and a half of steps (and never
fewer than ``MIN_MAX_GAP`` steps, so a slow model does not probe every few
tokens). A change of load shows as drift: when the recent steps at the current
count run well slower (or faster) than they settled at, a probe runs at once, so
a core taken is followed within a few steps, and a core freed within the longest
wait between probes.

Each kind of step has its own choice ("lane"): one-token steps (llama.cpp runs
them on ``n_threads``), multi-sequence steps (serve; ``n_threads_batch``, as any
ubatch of more than one token) and prefill ubatches; a batch kind is split by
size class (powers of two), since a step of 8 tokens and one of 512 are not
compared per token. Times are per token of the step.

Pure Python, no llama_cpp: the engine asks ``choose`` before each step and
tells ``observe`` its time (``localllm.engine.threadctl``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("token", "multi", "prefill")

WARMUP = 12
"""Steps at a lane's count before its first probe: the first steps of a
generation include the OpenMP team's start and a cold cache..."""
WARMUP_S = 0.5
"""...or this much time of them (at least 3 steps), whichever comes first: on a
machine so busy that a step takes half a second, 12 steps would be 6 s."""
BASE_GAP = 24
"""Steps between probes in one direction, before a probe there has lost."""
MIN_MAX_GAP = 64
"""The longest wait between probes is at least this many steps: at 200 ms a
step (a large model), 1.5 s would be 8 steps, and a lost probe each 8 steps would
cost 4% of the tokens."""
MAX_GAP_S = 1.5
"""...and at least this much time of steps: the bound on following a freed core."""
MARGIN = 0.04
"""A probe must beat the current count's recent median by this share: within it,
the count stays (hysteresis, so two counts that run alike do not alternate)."""
BUDGET = 0.01
"""What lost probes may cost, as a share of the time of the steps between them:
a probe that lost by 640 ms (2 threads against 1 with a core taken, on a busy
machine: 700 ms a step against 60) waits for 64 s of steps before the next, where
one that lost by 3.5 ms (on an idle machine) waits only for its gap in steps."""
DRIFT = 1.25
"""Recent steps this much slower (or faster) than the settled time: the load changed."""
DRIFT_STEPS = 3
OTHERS_S = 0.5
"""How often (seconds of one-token steps) the cores other programs use are read
(``threads.others.other_cores``), where the engine can read them: a core freed while the
count is below the most is seen within this, where step times at the lower count
do not show it (a step at 1 thread of 2 is as long with the other core taken as
with it free), and the probe the budget would hold back runs at once."""
OTHERS_MAX_S = 8.0
"""...doubled after each such probe that lost (a machine where fewer threads are
simply faster), up to this."""
FREE = 0.6
"""Cores neither this count nor other programs use, for a core to count as free;
other programs using this many cores were using one (the reason said for a drop)."""


@dataclass(frozen=True)
class Change:
    """One move of a lane's count, and why (the text users see)."""

    kind: str
    old: int
    new: int
    reason: str
    t_ns: int  # when (the controller's clock: time.perf_counter_ns by default)
    new_ms: float  # per token of the step, at the new count (the probe's steps)
    old_ms: float  # ... at the old count (its recent median)

    def line(self) -> str:
        """``2 → 1: another process is using a core (1 thread 14.1 ms a token, 2: 25.3 ms)``."""
        s = "" if self.new == 1 else "s"
        return f"{self.old} → {self.new}: {self.reason} ({self.new} thread{s} {self.new_ms:.2f} ms a token, {self.old}: {self.old_ms:.2f} ms)"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "from": self.old, "to": self.new, "reason": self.reason, "line": self.line(),
                "new_ms_per_token": round(self.new_ms, 4), "old_ms_per_token": round(self.old_ms, 4)}


class _Lane:
    """One kind (and size class) of step: its count, recent times and probe schedule."""

    def __init__(self, kind: str, n: int) -> None:
        self.kind = kind
        self.n = n
        self.recent: deque[float] = deque(maxlen=9)  # ns per token at n, newest last
        self.settled: float | None = None  # a slow average at n: what drift is measured against
        self.steps = 0
        self.next_probe = WARMUP
        self.gap = {-1: BASE_GAP, 1: BASE_GAP}
        self.direction = -1
        self.probe: int | None = None  # the count being probed
        self.probe_times: list[float] = []
        self.drift = 0  # consecutive steps past the drift bound (+ slower, - faster)
        self.contended = False  # the last move down followed a slowdown: another process took a core
        self.warm_ns = 0.0  # time of the steps before the first probe (WARMUP_S)
        self.credit_ns = 0.0  # what probes may still cost (BUDGET); below 0 none starts but for a change of load
        self.urgent = False  # the load changed: probe now, whatever the credit
        self.capped_from: int | None = None  # lowered with the one-token count when a core was taken; back up when freed
        self.hinted = False  # the probe running was started because a core was seen free (OTHERS_S)


class ThreadController:
    """Thread counts per kind of step, between ``lo`` and ``hi``, starting at ``start``.

    ``fixed``: the count never moves (``--threads N``, the cockpit's setting).
    ``clock``: nanoseconds, for the changes' timestamps (a simulation passes its own).
    ``others``: the cores other programs kept busy since its last call, or None
    when unknown (``threads.others.other_cores``; a simulation passes its own)."""

    def __init__(self, start: int, *, lo: int = 1, hi: int | None = None, fixed: bool = False, why: str = "",
                 clock: Callable[[], int] | None = None, others: Callable[[], float | None] | None = None) -> None:
        hi = max(start, 1) if hi is None else hi
        self.lo, self.hi = max(1, lo), max(1, hi)
        self.start = min(max(start, self.lo), self.hi)
        self.fixed = fixed
        self.why = why
        self._clock = clock or time.perf_counter_ns
        self._lanes: dict[str, _Lane] = {}
        self._latest: dict[str, _Lane] = {}  # per kind, the lane that ran last
        self.changes: list[Change] = []
        self.steps = 0
        self.probes = 0
        self._others = others
        self._others_ns = 0.0  # one-token step time since the others were last read
        self._others_gap = OTHERS_S
        self.others_busy: float | None = None  # cores other programs used over the last read's span

    # -- the engine's two calls ------------------------------------------------------
    def choose(self, kind: str, size: int = 1) -> int:
        """The count to run the next step of ``kind`` (``size`` tokens) with."""
        if self.fixed:
            return self.start
        lane = self._lane(kind, size)
        if lane.probe is not None:
            return lane.probe
        # A change of load (urgent) skips the wait in steps, not the credit: on a machine
        # busy enough that step times drift all the time, drift alone would probe often.
        due = lane.steps >= lane.next_probe or lane.warm_ns >= WARMUP_S * 1e9 or lane.urgent
        if due and lane.credit_ns >= 0 and len(lane.recent) >= 3:
            lane.warm_ns = -math.inf  # warmed up: from now on, the schedule in steps
            if lane.urgent and not self.lo <= lane.n + lane.direction <= self.hi:
                # slower at the fewest threads (or faster at the most): no count on that side to try,
                # and the other side is the one the change of load made worse
                lane.urgent = False
                return lane.n
            urgent, lane.urgent = lane.urgent, False
            d = lane.direction if self.lo <= lane.n + lane.direction <= self.hi else -lane.direction
            if self.lo <= lane.n + d <= self.hi:
                # Slower all at once with many threads: half of them first (8 → 4, then
                # neighbours up), since one thread fewer of eight runs hardly faster while
                # three cores are taken, and single steps would stall on that plateau.
                step = max(1, lane.n // 2) if urgent and d < 0 and lane.n >= 4 else 1
                lane.probe, lane.probe_times = max(self.lo, lane.n + d * step), []
                self.probes += 1
                return lane.probe
            lane.next_probe = lane.steps + 10**9  # lo == hi: nothing to try
        return lane.n

    def observe(self, kind: str, size: int, n: int, ns: int) -> None:
        """A step of ``kind`` with ``size`` tokens ran at ``n`` threads in ``ns`` nanoseconds."""
        self.steps += 1
        if self.fixed or ns <= 0:
            return
        lane = self._lane(kind, size)
        lane.steps += 1
        lane.warm_ns += ns
        t = ns / max(size, 1)
        if self._others is not None and kind == "token":
            self._others_ns += ns
            if self._others_ns >= self._others_gap * 1e9:
                self._others_ns = 0.0
                self._read_others(lane)
        if lane.probe is not None and n == lane.probe:
            self._probed(lane, t, size)
        elif n == lane.n:
            self._at_current(lane, t, size)

    # -- what users see --------------------------------------------------------------
    def current(self) -> dict[str, int]:
        """The count each kind ran last (kinds not run yet: absent)."""
        if self.fixed:
            return {k: self.start for k in self._latest} or {"token": self.start}
        return {k: lane.n for k, lane in self._latest.items()}

    def count(self, kind: str = "token") -> int:
        """The count ``kind`` runs at now (the start until it has run)."""
        lane = self._latest.get(kind)
        return self.start if self.fixed or lane is None else lane.n

    def last_change(self, kind: str = "token") -> Change | None:
        return next((c for c in reversed(self.changes) if c.kind == kind), None)

    def status(self, kind: str = "token") -> str:
        """One phrase: ``threads 1 (2 → 1: another process is using a core ...)``."""
        n = self.count(kind)
        if self.fixed:
            return f"threads {n} (fixed)"
        c = self.last_change(kind)
        return f"threads {n} ({c.line()})" if c is not None else f"threads {n} (adaptive, start: {self.why or n})"

    def short(self, kind: str = "token") -> str:
        """The cockpit's figure: ``threads 1 · 2 → 1: another process is using a core``."""
        n = self.count(kind)
        if self.fixed:
            return f"threads {n} · fixed"
        c = self.last_change(kind)
        return f"threads {n} · {c.old} → {c.new}: {c.reason}" if c is not None else f"threads {n} · adaptive"

    def report(self, since: int = 0, start_ns: int | None = None) -> dict[str, Any]:
        """The JSON shape ``run --json`` prints: mode, start and why, the count per
        kind now, and the changes from index ``since`` (``at_s``: seconds after ``start_ns``)."""
        changes = []
        for c in self.changes[since:]:
            d = c.to_dict()
            d["at_s"] = round((c.t_ns - start_ns) / 1e9, 3) if start_ns is not None else None
            changes.append(d)
        return {"mode": "fixed" if self.fixed else "adaptive", "start": self.start, "why_start": self.why or None,
                "range": [self.lo, self.hi], "now": self.current(), "changes": changes, "probes": None if self.fixed else self.probes}

    # -- inside ----------------------------------------------------------------------
    def _lane(self, kind: str, size: int) -> _Lane:
        key = kind if kind == "token" else f"{kind}:{max(size, 1).bit_length()}"
        lane = self._lanes.get(key)
        if lane is None:
            prev = self._latest.get(kind)  # a new size class starts where its kind is
            lane = self._lanes[key] = _Lane(kind, prev.n if prev is not None else self.start)
        self._latest[kind] = lane
        return lane

    def _read_others(self, lane: _Lane) -> None:
        """Read the cores other programs used; with a core free and the count
        below the most, probe one thread more now (whatever the budget says)."""
        assert self._others is not None
        busy = self._others()
        self.others_busy = busy
        if busy is None or lane.probe is not None or lane.n >= self.hi:
            return
        if self.hi - lane.n - busy >= FREE:
            lane.urgent, lane.direction, lane.hinted = True, 1, True
            lane.credit_ns = max(lane.credit_ns, 0.0)

    def _max_gap(self, lane: _Lane) -> int:
        ref = statistics.median(lane.recent) if lane.recent else 0.0
        return max(MIN_MAX_GAP, int(MAX_GAP_S * 1e9 / ref) if ref > 0 else MIN_MAX_GAP)

    def _at_current(self, lane: _Lane, t: float, size: int) -> None:
        lane.recent.append(t)
        # Banked credit is capped at two steps' time: an idle hour must not pay for a
        # run of probes that each lose by ten steps once a core is taken.
        lane.credit_ns = min(lane.credit_ns + BUDGET * t * size, 2 * t * size)
        if lane.settled is None:
            if len(lane.recent) >= 3:
                lane.settled = statistics.median(lane.recent)
            return
        last = list(lane.recent)[-DRIFT_STEPS:]
        fast = statistics.median(last)
        if fast > lane.settled * DRIFT:
            lane.drift = lane.drift + 1 if lane.drift > 0 else 1
        elif fast * DRIFT < lane.settled:
            lane.drift = lane.drift - 1 if lane.drift < 0 else -1
        else:
            lane.drift = 0
            lane.settled += 0.05 * (t - lane.settled)
        # Two steps at twice the settled time are no noise: a core was taken (135 ms a
        # step against 14 with a hog here); a third slow step would cost more than a probe.
        jump = len(last) >= 2 and min(last[-2:]) > 2 * lane.settled
        if abs(lane.drift) >= DRIFT_STEPS or jump:
            lane.drift = max(lane.drift, 1) if jump else lane.drift
            # The load changed: what the steps before said no longer holds. Slower:
            # try fewer threads first (a core was taken); faster: try more.
            lane.recent = deque(last, maxlen=lane.recent.maxlen)
            lane.settled = fast
            lane.direction = -1 if lane.drift > 0 else 1
            lane.contended = lane.contended or lane.drift > 0  # a core taken; its return is told when more threads win
            lane.gap = {-1: BASE_GAP, 1: BASE_GAP}
            lane.urgent = True
            lane.drift = 0

    def _probed(self, lane: _Lane, t: float, size: int) -> None:
        lane.probe_times.append(t)
        ref = statistics.median(lane.recent)
        d = -1 if lane.probe is None or lane.probe < lane.n else 1
        if t > ref * (1 - MARGIN):  # lost: back to the current count, and wait longer before trying this way again
            lane.credit_ns -= max(0.0, t - ref) * size
            lane.gap[d] = min(lane.gap[d] * 2, self._max_gap(lane))
            if lane.hinted:  # a free core that did not make more threads faster: read the others less often
                self._others_gap = min(self._others_gap * 2, OTHERS_MAX_S)
            lane.hinted = False
            self._end_probe(lane, d)
            return
        if len(lane.probe_times) < 2:
            return  # one more step at the probed count confirms it
        old, new = lane.n, lane.probe
        assert new is not None
        taken = self.others_busy is not None and self.others_busy >= FREE
        if d < 0:
            reason = "another process is using a core" if lane.contended or taken else "fewer threads measured faster"
            lane.contended = lane.contended or taken
        else:
            reason = "a core is free again" if lane.contended or lane.hinted else "more threads measured faster"
            lane.contended = False
            self._others_gap = OTHERS_S
        lane.hinted = False
        self.changes.append(Change(lane.kind, old, new, reason, self._clock(),
                                   statistics.mean(lane.probe_times) / 1e6, ref / 1e6))
        lane.n = new
        lane.recent = deque(lane.probe_times, maxlen=lane.recent.maxlen)
        lane.settled = statistics.mean(lane.probe_times)
        lane.gap = {d: BASE_GAP, -d: min(BASE_GAP * 2, self._max_gap(lane))}
        lane.probe, lane.probe_times = None, []
        lane.direction = d  # keep going the way that won (8 → 7 → 6 under a heavier load)
        lane.next_probe = lane.steps + BASE_GAP // 2
        if lane.kind == "token" and reason in ("another process is using a core", "a core is free again"):
            self._follow(d, new)

    def _follow(self, d: int, new: int) -> None:
        """A core taken (or freed) slows every kind of step, and a batch step may
        come once a prompt, too seldom to learn from alone (a 40-token prompt ran
        6.3 s on 2 threads with a core taken, here): the other lanes follow the
        one-token steps down, and back up to where they were."""
        for other in self._lanes.values():
            if other.kind == "token" or other.probe is not None:
                continue
            if d < 0 and other.n > new:
                other.capped_from = other.capped_from or other.n
                other.n = new
            elif d > 0 and other.capped_from is not None:
                other.n, other.capped_from = other.capped_from, None
            else:
                continue
            other.recent.clear()
            other.settled = None

    def _end_probe(self, lane: _Lane, d: int) -> None:
        lane.probe, lane.probe_times = None, []
        other = -d if self.lo <= lane.n - d <= self.hi else d
        lane.direction = other
        lane.next_probe = lane.steps + lane.gap[other]
