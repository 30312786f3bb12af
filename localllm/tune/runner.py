"""The measuring loop: stage after stage, each stage's candidates alternated
(A B C A B C: a load that comes or goes touches each alike), the time left
estimated from the runs so far, and whatever was measured kept when Ctrl+C
ends it (``Tuner.stages`` holds every run as it lands).

The engine, the planner and the quality measurement come in as functions, so
the loop is tested with a clock and fake measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from localllm.tune import choose
from localllm.tune.candidates import KV_TYPE, Setting, stage
from localllm.tune.choose import Result, Run


class BecameBusy(Exception):
    """Another program took the CPU while a stage ran: that stage's figures are the load's, not the settings'."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


@dataclass
class Stage:
    """One setting's candidates and what became of them."""

    key: str
    results: list[Result] = field(default_factory=list)
    skipped: str | None = None  # why it was not measured ("fixed by --threads 2", "one core: nothing to compare")
    done: bool = False  # every round ran
    chosen: Result | None = None
    busy: str | None = None  # what took the CPU while it ran: its figures are not used


    def decided(self) -> bool:
        """Whether it has a winner to keep: every round ran, or (interrupted) every candidate ran once."""
        return self.busy is None and (self.done or (bool(self.results) and all(r.runs or not r.fits for r in self.results)))

    def to_dict(self, max_kl: float) -> dict[str, Any]:
        return {"setting": self.key, "skipped": self.skipped, "complete": self.done, "busy": self.busy,
                "chosen": None if self.chosen is None else self.chosen.setting.value(self.key),
                "candidates": [{"value": r.setting.value(self.key), "chosen": r is self.chosen,
                                "not_chosen_because": choose.eligible(r, max_kl, self.results[0].setting), **r.to_dict()} for r in self.results]}


@dataclass(frozen=True)
class Plan:
    """What the plan says of a candidate: the bytes and whether it fits as asked."""

    fits: bool
    memory: tuple[int, int] | None
    why_not: str | None = None


@dataclass(frozen=True)
class Quality:
    kl_mean: float
    kl_p99: float
    top1: float


class Tuner:
    """``stages`` (keys with their candidate values, or a reason to skip), measured
    in order from ``base``. ``measure(setting, round)`` is one run; ``plan(setting)``
    the memory verdict; ``quality(types)`` the KV caches' cost against f16 (called
    once, before the cache stage's runs); ``progress(line)`` gets a line per run;
    ``busy()`` after each stage's runs says what else took the CPU meanwhile, if
    anything did (then ``BecameBusy``: the stage is not decided)."""

    def __init__(self, base: Setting, stages: Sequence[tuple[str, list[Any] | str]], *, rounds: int,
                 measure: Callable[[Setting, int], Run], plan: Callable[[Setting], Plan],
                 quality: Callable[[list[str]], dict[str, Quality]] | None = None,
                 progress: Callable[[str], None] | None = None, max_kl: float = choose.MAX_KL,
                 busy: Callable[[], str | None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.best = base
        self.plan_of = plan
        self.measure = measure
        self.quality = quality
        self.progress = progress or (lambda line: None)
        self.rounds = rounds
        self.max_kl = max_kl
        self.clock = clock
        self.busy = busy or (lambda: None)
        self.stages = [Stage(k, skipped=v) if isinstance(v, str) else Stage(k) for k, v in stages]
        self._values = {k: v for k, v in stages if not isinstance(v, str)}
        self.total = sum(len(v) * rounds for v in self._values.values())  # runs planned (the real count may be fewer: a value not fitting)
        self.kv_quality: dict[str, Quality] = {}  # by cache type, once measured
        self.done = 0
        self.quality_s: float | None = None  # seconds the quality check took
        self._spent = 0.0  # seconds in runs so far

    @property
    def runs_s(self) -> float:
        """Seconds in the runs so far (loads, warm-ups and the timed prompts and replies)."""
        return self._spent

    def left_s(self) -> float | None:
        """Seconds left at the pace so far (None before the first run)."""
        if not self.done:
            return None
        return self._spent / self.done * max(self.total - self.done, 0)

    def run(self) -> Setting:
        """Every stage; returns the best setting (``best`` meanwhile: the best so far)."""
        for st in self.stages:
            if st.skipped is None:
                self._stage(st)
        return self.best

    def _stage(self, st: Stage) -> None:
        for s in stage(st.key, self.best, self._values[st.key]):
            verdict = self.plan_of(s)
            st.results.append(Result(s, fits=verdict.fits, memory=verdict.memory, why_not=verdict.why_not))
            self._rate(st.results[-1])
        planned = len(self._values[st.key]) * self.rounds
        measured = [r for r in st.results if r.fits]
        self.total += len(measured) * self.rounds - planned  # the values that do not fit are not run
        if st.key == KV_TYPE:
            self._quality(st)
        if len(measured) < 2:
            st.skipped = "only one value fits the plan" if len(st.results) > 1 else "one value: nothing to compare"
            st.chosen = st.results[0]
            st.done = True
            return
        for rnd in range(self.rounds):
            for r in measured:
                self.progress(self._line(st, r.setting, rnd))
                t0 = self.clock()
                r.runs.append(self.measure(r.setting, rnd))
                self._spent += self.clock() - t0
                self.done += 1
        st.done = True
        why = self.busy()
        if why is not None:
            st.busy = why
            raise BecameBusy(st.key, why)
        self.decide(st)

    def decide(self, st: Stage) -> None:
        """The stage's winner becomes the best so far."""
        st.chosen = choose.winner(st.results, max_kl=self.max_kl)
        self.best = st.chosen.setting

    def _quality(self, st: Stage) -> None:
        types = [r.setting.kv_type for r in st.results if r.setting.kv_type != "f16"]
        if not types or self.quality is None:
            return
        self.progress(f"quality of the {', '.join(types)} KV cache{'s' if len(types) > 1 else ''} against f16 (KL divergence on the shipped prose)")
        t0 = self.clock()
        self.kv_quality.update(self.quality(types))
        self.quality_s = self.clock() - t0
        for r in st.results:
            self._rate(r)

    def _rate(self, r: Result) -> None:
        """A cache type's quality cost, on every candidate that has that cache (later stages' too)."""
        r.reference = bool(self.kv_quality) and r.setting.kv_type == "f16"  # KL 0 by definition, once the others are measured against it
        q = self.kv_quality.get(r.setting.kv_type)
        if q is not None:
            r.kl_mean, r.kl_p99, r.top1 = q.kl_mean, q.kl_p99, q.top1

    def _line(self, st: Stage, s: Setting, rnd: int) -> str:
        left = self.left_s()
        eta = "time left: estimating" if left is None else f"about {_duration(left)} left"
        return f"[{self.done + 1}/{self.total}] {st.key} {s.value(st.key)}, round {rnd + 1}/{self.rounds} · {eta}"

    def interrupted(self) -> Setting:
        """After Ctrl+C: the stage under way decided on what it measured, if every
        candidate ran at least once; the best setting from what was decided."""
        for st in self.stages:
            if st.skipped is None and st.chosen is None and st.decided():
                self.decide(st)
        return self.best

    def decided(self) -> list[Stage]:
        """The stages whose winner stands: measured to the end, or far enough when interrupted."""
        return [st for st in self.stages if st.skipped is None and st.chosen is not None]


def _duration(s: float) -> str:
    s = max(0, round(s))
    return f"{s} s" if s < 90 else f"{s // 60} min {s % 60:02d} s"
