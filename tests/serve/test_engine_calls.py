"""``Scheduler.run``: other llama.cpp work (serve's embeddings) runs on the engine
thread between two steps, so that one thread makes every decode of the process
(serve/scheduler.py's docstring; the symptom on real llama.cpp is checked in
tests/serve/test_embeddings.py)."""

from __future__ import annotations

import threading
import time

import pytest

from localllm.errors import EngineError
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.scheduler import Scheduler


def _scheduler() -> Scheduler:
    # no request is submitted: the model is never called
    return Scheduler(object(), n_seq=1, n_ctx_seq=16, n_batch=8, prefix_reuse=False, max_queue=1, prefill_chunk=8,  # type: ignore[arg-type]
                     metrics=ServerMetrics())


def test_a_call_runs_on_the_engine_thread_and_its_result_or_error_comes_back() -> None:
    sched = _scheduler()
    sched.start()
    try:
        assert sched.run(lambda: threading.current_thread().name) == "localllm-engine" != threading.current_thread().name
        with pytest.raises(ValueError, match="bad input"):
            sched.run(lambda: int("bad input"))
        # from several threads at once, each gets its own answer
        got: dict[int, int] = {}
        workers = [threading.Thread(target=lambda k=k: got.__setitem__(k, sched.run(lambda: k * k))) for k in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(10)
        assert got == {k: k * k for k in range(8)}
    finally:
        sched.stop()


def test_no_call_is_taken_once_stopped() -> None:
    sched = _scheduler()
    sched.start()
    sched.stop()
    with pytest.raises(EngineError, match="stopping"):
        sched.run(lambda: 1)


def test_an_abort_ends_the_calls_still_waiting_with_its_reason() -> None:
    sched = _scheduler()
    sched.start()
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(10)

    first = threading.Thread(target=lambda: sched.run(hold))
    first.start()
    assert busy.wait(10)  # the engine thread is inside the first call
    errors: list[BaseException] = []

    def second() -> None:
        try:
            sched.run(lambda: 2)
        except EngineError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=second)
    waiting.start()
    deadline = time.monotonic() + 10
    while not sched._calls and time.monotonic() < deadline:  # queued behind the first
        time.sleep(0.001)
    sched.abort("the RPC worker is gone")
    waiting.join(10)
    release.set()
    first.join(10)
    sched.stop()
    assert [str(e) for e in errors] == ["the RPC worker is gone"]
