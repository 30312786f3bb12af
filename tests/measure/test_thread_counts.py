"""doctor's contention line and its thread-count advice (issue 50 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys

from localllm.measure.starved import Busy, Contention, contention
from localllm.measure.thread_counts import thread_action


def test_a_count_is_named_only_when_it_measured_clearly_faster() -> None:
    hog = "yes (pid 7) is using 98% of a core"
    tip = thread_action({1: 68.2, 2: 41.0}, 2, hog)
    assert tip is not None and tip.action.startswith("--threads 1") and tip.basis == "measured"
    assert "x1.66" in tip.expected and "68.2 t/s on 1 against 41.0 t/s on 2 threads" in tip.expected and tip.why.startswith(hog)
    assert thread_action({1: 70.0, 2: 74.0}, 2, None) is None  # the start is the fastest
    assert thread_action({1: 72.0, 2: 70.0}, 2, None) is None  # 3% is inside what one reply varies
    assert thread_action({1: 50.0}, 2, None) is None  # the start was not measured: nothing to compare
    up = thread_action({1: 40.0, 2: 70.0}, 1, None)
    assert up is not None and up.action.startswith("--threads 2") and "measured here" in up.why


def test_the_contention_line_says_what_it_measured_and_n_a_for_what_it_could_not() -> None:
    quiet = Contention(cores=2, run_queue=0.4, running=0, busy_percent=3.0, steal_percent=0.0, busiest=None)
    assert not quiet.busy and "run queue 0.4 on 2 CPUs, 0 runnable now, 3% busy, steal 0%" in quiet.words()
    taken = Contention(cores=2, run_queue=None, running=None, busy_percent=60.0, steal_percent=None, busiest=Busy("yes", 7, 98.0))
    assert taken.busy and "run queue n/a" in taken.words() and "steal n/a" in taken.words() and "yes (pid 7) 98% of a core" in taken.words()
    assert Contention(2, 0.1, 0, 5.0, 25.0, None).busy  # a hypervisor taking a quarter of the time is contention too


def test_contention_on_this_machine_leaves_this_process_out_and_sees_a_hog() -> None:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        c = contention(1.0)
    finally:
        hog.kill()
        hog.wait()
    assert c.cores >= 1 and 0 <= c.busy_percent <= 100
    assert c.busiest is not None and c.busiest.pid != os.getpid() and c.busiest.cpu_percent >= 50  # the hog, or something busier
    if sys.platform.startswith("linux"):
        assert c.run_queue is not None and c.running is not None and c.steal_percent is not None
