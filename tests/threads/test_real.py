"""The thread count follows a real load: SmolLM2 decoding in llama.cpp while a
child process spins on one core (a "hog"). The count drops while the hog runs
and rises once it stops. Bounded: about 20 s at most.

The decoding runs in a child Python (this file run as a script), not in the
test's process: under ``pytest -n`` a worker is pinned to one CPU when it
starts (tests/conftest.py), and libgomp counts the CPUs it may use once, when
llama.cpp first runs; a team of more threads than that count sleeps at every
barrier instead of spinning, so in a worker 2 threads ran slower than 1 even on
an idle machine (33-53 ms a token against 19-31), and the count rightly never
rose. A fresh process started with every CPU counts them all."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig


def _spin() -> None:
    while True:
        pass


def _tokens(backend: LlamaCppBackend) -> Iterator[None]:
    """Tokens without end: a new generation whenever the context fills."""
    sampling = SamplingConfig(temperature=0.0, max_tokens=-1, ignore_eos=True)
    while True:
        with backend.stream("Tell me a very long story about a lighthouse keeper.", sampling) as gen:
            for _ in gen:
                yield None


def _until(backend: LlamaCppBackend, tokens: Iterator[None], want: int, seconds: float) -> float | None:
    """Decode until the one-token count is ``want``; the seconds it took, or None past ``seconds``."""
    ctl = backend.threads
    assert ctl is not None
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        next(tokens)
        if ctl.count("token") == want:
            return time.monotonic() - t0
    return None


def _busy_seconds() -> float:
    """CPU seconds every core has spent on anything but idle, since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def scenario(model: Path) -> dict:
    """Decode, start one hog per CPU but one, wait for the count to drop (9 s at most),
    stop the hogs, wait for it to rise (10 s at most): what happened, for the test."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    out: dict = {"cpus": len(cpus)}
    if len(cpus) < 2:
        return out
    # What other programs take before the test starts: on a machine already busier than
    # the hog, step times are the others' (2 s steps seen here at a load average of 5),
    # and neither move can be shown.
    out["others"] = psutil.cpu_percent(interval=0.5)
    out["load"] = os.getloadavg()[0]
    with LlamaCppBackend() as backend:
        backend.load(model, LoadConfig(n_ctx=2048, n_threads=None))
        ctl = backend.threads
        assert ctl is not None and not ctl.fixed
        tokens = _tokens(backend)
        for _ in range(4):  # the prompt read and decoding: the hog comes during a decode
            next(tokens)
        hogs = []
        try:
            # One hog per CPU but one: every core but one is taken, so the threads past one wait on a busy core.
            for _ in cpus[1:]:
                p = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
                p.start()
                hogs.append(p)
            out["dropped"] = _until(backend, tokens, 1, 9.0)
        finally:
            for p in hogs:
                p.kill()
                p.join()
        out["hogs"] = len(hogs)
        out["after_drop"] = [c.to_dict() for c in ctl.changes]
        before, own_before, t0 = _busy_seconds(), _own_seconds(), time.monotonic()
        out["rose"] = _until(backend, tokens, 2, 10.0) if out["dropped"] is not None else None
        # the cores' busy time beyond this process's own while it waited: another program holding the core the hog left
        out["taken"] = ((_busy_seconds() - before) - (_own_seconds() - own_before)) / (time.monotonic() - t0)
        out["changes"] = [c.to_dict() for c in ctl.changes]
        out["report"] = ctl.report()
        out["count"] = ctl.count("token")
    return out


@pytest.mark.slow
@pytest.mark.alone
def test_a_busy_core_drops_the_thread_count_and_its_end_raises_it(smollm2: Path) -> None:
    r = subprocess.run([sys.executable, __file__, str(smollm2)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    if d["cpus"] < 2:
        pytest.skip(f"needs 2 CPUs to take one of them, this process may run on {d['cpus']}")
    busy = f"the machine was busy before the test ({d['others']:.0f}% of its CPUs, load average {d['load']:.1f} on {d['cpus']})"
    if d["dropped"] is None and d["others"] >= 50:
        pytest.skip(f"{busy}: the count stayed at {d['count']} with a core taken")
    assert d["dropped"] is not None, f"the count stayed at {d['count']} with {d['hogs']} core(s) busy: {d['report']}"
    assert d["after_drop"] and d["after_drop"][-1]["to"] == 1
    if d["rose"] is None:
        if d["others"] >= 50 or d["taken"] >= 0.5:
            pytest.skip(f"{busy}; after the hog other programs kept {d['taken']:.1f} core(s) busy: 1 thread still measured faster")
        raise AssertionError(f"the count stayed at 1 after the hog stopped ({d['taken']:.1f} core(s) taken by others): {d['report']}")
    assert d["changes"][-1]["reason"] in ("a core is free again", "more threads measured faster")
    assert d["rose"] < 3.0, d  # a core freed is seen from the others' CPU time (threads.others.other_cores) within a second or two


if __name__ == "__main__":  # the child the test starts
    print(json.dumps(scenario(Path(sys.argv[1]))))
