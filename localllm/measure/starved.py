"""Is decode starved of CPU? On a busy laptop other programs take the cores
that llama.cpp's decode threads wait on, and decode collapses (measured: ITL
4,411 ms with every core asked for, while one thread ran at 69 t/s at the
same moment). The signal is a reply far below what this model already did on
this machine; the fix is fewer threads (named as a number) or the program
that holds the CPU (named, with its share).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import psutil

from localllm.util import fmt

STARVED_SHARE = 1 / 3
"""Below a third of the model's own earlier rate is not
the 10-15% that one reply varies from the next on a quiet machine: something
took the CPU."""


@dataclass(frozen=True)
class Busy:
    """The busiest other process over a short window, as ``top`` shows it."""

    name: str
    pid: int
    cpu_percent: float  # of one core: 190 is nearly two cores


def starved(rate: float | None, earlier: float | None) -> tuple[float, str] | None:
    """The reference that ``rate`` (decode t/s) fell below a third of, and what
    it is, or None when it did not (or nothing was measured). The reference is
    the model's own earlier rate on this machine, not the roofline: a small
    model's decode reaches a third of its bandwidth ceiling or less on an idle
    machine (per-token work that is not reading weights dominates it: the
    scripted fake model's ceiling is 50,995 t/s), so the roofline would cry
    wolf; the verdict line already says when decode is far below it."""
    if not rate or not earlier or rate >= STARVED_SHARE * earlier:
        return None
    return earlier, "this model reached earlier here"


class StarveWatch:
    """Each model's best decode rate so far, and whether it was told: the
    advice comes once a model (a second line would only repeat the fix)."""

    def __init__(self) -> None:
        self.best: dict[object, float] = {}
        self.told: set[object] = set()

    def check(self, model: object, rate: float | None) -> tuple[float, str] | None:
        """The reference ``rate`` fell under, the first time it does for
        ``model`` (any key: the app uses the file's path); then remember it."""
        reference = starved(rate, self.best.get(model))
        if rate and rate > self.best.get(model, 0.0):
            self.best[model] = rate
        if reference is None or model in self.told:
            return None
        self.told.add(model)
        return reference


def advice(rate: float, reference: tuple[float, str], threads: int, busy: Busy | None) -> str:
    """One line: what happened, and the fix. ``threads``: the decode threads now.
    With the busiest program known, the threads suggested leave it the cores
    it takes; without, half of them."""
    figure, what = reference
    head = f"decode ran at {rate:.1f} t/s, under a third of the {figure:.1f} t/s {what}"
    if busy is not None:
        n = max(1, threads - math.ceil(busy.cpu_percent / 100))
        cause = f"{busy.name} (pid {busy.pid}) is using {busy.cpu_percent:.0f}% CPU"
    else:
        n = max(1, threads // 2)
        cause = "another program may be using the CPU"
    if n < threads:
        fix = f"start with --threads {n} (F3: threads {n}) or close it"
    else:
        fix = "close it: one decode thread is already the fewest"
    return f"{head}: {cause}; {fix}"


def busiest_process(window_s: float = 0.5, exclude: int | None = None) -> Busy | None:
    """The process, other than ``exclude`` (this one by default), that used the
    most CPU over ``window_s`` seconds, or None when none used over a tenth of
    a core or the process table cannot be read. Blocks for ``window_s``: call it
    off the UI thread."""
    me = os.getpid() if exclude is None else exclude
    procs = []
    try:
        for p in psutil.process_iter(["name"]):
            if p.pid in (me, 0):
                continue
            try:
                p.cpu_percent(None)  # the first call starts the window
                procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(window_s)
        best: Busy | None = None
        for p in procs:
            try:
                cpu = p.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if cpu >= 10 and (best is None or cpu > best.cpu_percent):
                best = Busy(fmt.safe(p.info.get("name") or "?"), p.pid, cpu)  # a name is untrusted: escaped
        return best
    except (OSError, psutil.Error):
        return None
