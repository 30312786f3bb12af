"""threads.others.other_cores: the cores other programs use, read from the kernel's counters."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from localllm.threads.others import MIN_SPAN_S, other_cores


def _spin() -> None:
    while True:
        pass


@pytest.mark.alone
def test_a_spinning_child_is_one_core_and_this_process_is_none() -> None:
    """A child that spins on a core reads as about one core of the others'; this
    process spinning itself reads as none of theirs (its own time is taken off)."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    read = other_cores()
    assert read is not None
    time.sleep(MIN_SPAN_S)
    quiet = read()
    assert quiet is not None and quiet >= 0.0
    end = time.monotonic() + 0.6
    while time.monotonic() < end:  # this process busy: its own time, not the others'
        pass
    assert (mine := read()) is not None and mine < quiet + 0.5, (mine, quiet)
    hog = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    hog.start()
    try:
        time.sleep(0.5)  # started and spinning
        read()
        time.sleep(0.8)
        taken = read()
    finally:
        hog.kill()
        hog.join()
    assert taken is not None and taken >= 0.7, (taken, quiet)
    assert read() == taken  # a span shorter than the counters' ticks can show: the last figure again
