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

from localllm.threads.others import MIN_SPAN_S, other_cores  # noqa: F401 - the decode controller's reader of the others' load, here beside doctor's
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


@dataclass(frozen=True)
class Contention:
    """How busy the machine is, over a short window, before a measurement:
    what ``doctor`` says next to its figures (a slow decode on a busy machine
    is the machine's, not the model's)."""

    cores: int  # logical CPUs
    run_queue: float | None  # 1-minute load average (runnable and waiting tasks, as ``uptime`` shows it)
    running: int | None  # tasks runnable right now (/proc/loadavg's fourth field, less this process); None off Linux
    busy_percent: float  # all CPUs, over the window
    steal_percent: float | None  # time a hypervisor gave this VM's CPUs to others; None where the OS has no such count
    busiest: Busy | None

    @property
    def busy(self) -> bool:
        """Whether other work takes a core: a run queue past the cores, steal, or a process using half a core or more."""
        return bool((self.run_queue is not None and self.run_queue > self.cores)
                    or (self.steal_percent or 0) >= 10 or (self.busiest is not None and self.busiest.cpu_percent >= 50))

    @property
    def taken(self) -> bool:
        """Whether another program (half a core or more) or the hypervisor (steal) takes CPU
        now: ``busy`` less the load average, which a measuring process's own threads
        raise for a minute after it ran (``tune`` asks this between its stages)."""
        return bool((self.steal_percent or 0) >= 10 or (self.busiest is not None and self.busiest.cpu_percent >= 50))

    def cause(self) -> str:
        """What makes it ``busy``, in a few words: the busiest program first, as the one to close."""
        b = self.busiest
        if b is not None and b.cpu_percent >= 50:
            return f"{b.name} (pid {b.pid}) is using {b.cpu_percent:.0f}% of a core"
        if (self.steal_percent or 0) >= 10:
            return f"the hypervisor gives {self.steal_percent:.0f}% of this VM's CPU time to others (steal)"
        if self.run_queue is not None and self.run_queue > self.cores:
            return f"the run queue is {self.run_queue:.1f} on {self.cores} CPUs"
        return "nothing"

    def words(self) -> str:
        """``run queue 2.4 on 2 CPUs, 1 runnable now, 63% busy, steal 0%; busiest: yes (pid 12) 98% of a core``."""
        queue = "n/a" if self.run_queue is None else f"{self.run_queue:.1f}"
        now = "" if self.running is None else f", {self.running} runnable now"
        steal = "n/a" if self.steal_percent is None else f"{self.steal_percent:.0f}%"
        who = "none over a tenth of a core" if self.busiest is None else (
            f"{self.busiest.name} (pid {self.busiest.pid}) {self.busiest.cpu_percent:.0f}% of a core")
        return f"run queue {queue} on {self.cores} CPUs{now}, {self.busy_percent:.0f}% busy, steal {steal}; busiest other program: {who}"


def contention(window_s: float = 0.5) -> Contention:
    """The machine's load now: run queue, CPU busy and steal over ``window_s``, and
    the busiest other process (``busiest_process``). Blocks for ``window_s``."""
    cores = psutil.cpu_count() or 1
    try:
        queue: float | None = psutil.getloadavg()[0]
    except (OSError, AttributeError):
        queue = None
    psutil.cpu_times_percent(None)  # starts the window for the call after busiest_process's sleep
    busiest = busiest_process(window_s)
    times = psutil.cpu_times_percent(None)
    steal = getattr(times, "steal", None)
    return Contention(cores, queue, _runnable(), max(0.0, 100.0 - times.idle - getattr(times, "iowait", 0.0)),
                      float(steal) if steal is not None else None, busiest)


def _runnable() -> int | None:
    """Tasks runnable now, this one left out (Linux's /proc/loadavg: ``0.52 0.40 0.33 2/611 12345``)."""
    try:
        with open("/proc/loadavg") as f:
            field = f.read().split()[3]
        return max(0, int(field.split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None
