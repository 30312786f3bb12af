"""How many of this process's CPUs other programs kept busy: the thread
controller's reader of the others' load (``other_cores``). It sits below the
engine, which builds the controller with it (the engine may not import
``measure``); ``measure.starved``, doctor's contention detector, re-exports it,
so that the load of other programs is read in one family of code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

MIN_SPAN_S = 0.3
"""The shortest span read: /proc/stat and the process's times count in ticks of
10 ms, so over 40 ms one tick of rounding on each of two CPUs read as half a
core (seen while the count waited to rise again)."""


def _busy(cpus: list[int] | None) -> float | None:
    """CPU seconds the ``cpus`` spent on anything but idle and I/O wait, since boot."""
    try:
        per = psutil.cpu_times(percpu=True)
    except (OSError, RuntimeError, AttributeError):
        return None
    chosen = [per[i] for i in cpus if i < len(per)] if cpus is not None else per
    if not chosen:
        return None
    return sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in chosen)


def _own() -> float:
    t = os.times()
    return t.user + t.system


def other_cores() -> Callable[[], float | None] | None:
    """A function that returns the cores other programs kept busy (on this
    process's CPUs) since its last call, or None where that cannot be read; None
    itself where the CPUs' times cannot be read at all.

    The thread controller's signal that a core taken has been freed, which step
    times at fewer threads cannot show: at one thread of two, with the other core
    taken, a step takes as long as it does once the core is free again, so the
    count could only rise by probing, and a probe at two threads while the core is
    still taken loses several steps' time (the controller's budget then waits long
    before the next). The kernel knows at once: the CPUs' busy time (``/proc/stat``
    through psutil) less this process's own CPU time is what the others used. Only
    the CPUs this process may run on are counted (``sched_getaffinity``): a pinned
    process, or a container whose ``/proc/stat`` shows more CPUs, is not told of
    cores it cannot use."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    first = _busy(cpus)
    if first is None:
        return None
    state = [first, _own(), time.monotonic()]

    last: list[float | None] = [None]

    def others() -> float | None:
        now = time.monotonic()
        if now - state[2] < MIN_SPAN_S:  # the counters tick at 100 Hz: a short span is mostly rounding
            return last[0]
        busy, own = _busy(cpus), _own()
        if busy is None:
            return None
        used = max(0.0, ((busy - state[0]) - (own - state[1])) / (now - state[2]))
        state[:] = [busy, own, now]
        last[0] = used
        return used

    return others
