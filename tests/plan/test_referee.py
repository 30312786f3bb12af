"""llama.cpp as the referee: its dry run (no_alloc, load_mode NONE, in a child
process) gives ``plan`` the compute and output buffers where the graph replay
does not cover a model, cross-checks them where it does, and refuses what
llama.cpp refuses, including what the rules miss. An abort or a hang in the dry
run costs the figure, never the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.plan import referee
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.cli import cli


def _plan(*args: str) -> dict:
    r = cli("plan", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_where_the_replay_covers_the_model_the_dry_run_agrees(smollm2: Path) -> None:
    d = _plan(str(smollm2), "--ctx", "4096", "--kv-type", "q8_0")
    assert d["sources"]["compute"] == "graph replay" and d["sources"]["kv_cache"] == "llama.cpp's rules"
    dry = d["dry_run"]["buffers"]["CPU"]["compute"]
    assert abs(dry - d["compute_bytes"]) <= 0.006 * 2**20  # llama.cpp prints MiB to two decimals
    assert d["compute_cpu_bytes"] == d["compute_bytes"]


@pytest.mark.slow
def test_where_it_does_not_the_figure_is_llama_cpps_own(tmp_path: Path) -> None:
    """A deci model (an architecture the replay does not cover): plan's compute
    is the dry run's, and it equals what a real load allocates."""
    from localllm.engine import LlamaCppBackend

    path = write_gguf(tmp_path / "deci.gguf", SynthSpec(arch="deci", name="synthetic-deci", n_embd=128, n_head=4, kv_heads_per_layer=(4, 1)))
    d = _plan(str(path), "--ctx", "1024")
    # llama.cpp's figure, so not an estimate: the JSON says what the table says (issue 45 item 7)
    assert d["compute_estimated"] is False and d["sources"]["compute"] == "llama.cpp's dry run"
    with LlamaCppBackend() as b:
        b.load(path, LoadConfig(n_ctx=1024))
        real = sum(b.logged_buffers["CPU"]["compute"])
    assert d["compute_cpu_bytes"] / 2**20 == pytest.approx(real, abs=0.006)
    # the total is made of the figures shown
    assert d["total_cpu_bytes"] == d["weights_cpu_bytes"] + d["kv_cache_bytes"] + d["compute_cpu_bytes"] + d["output_cpu_bytes"]
    text = cli("plan", str(path), "--ctx", "1024").stdout
    assert "compute (llama.cpp's dry run)" in text and "the graph replay does not cover this model" in text


@pytest.mark.slow
def test_plan_refuses_what_only_llama_cpp_knows(synth_case) -> None:
    """MLA (deepseek2) keeps one latent cache: llama.cpp refuses different K and
    V types, a rule localllm does not write down. The dry run says so."""
    path = synth_case("deepseek2")
    r = cli("plan", str(path), "--ctx", "512", "--k-type", "q8_0", "--v-type", "f16")
    assert r.returncode == 1
    assert "llama.cpp refuses this config" in r.stderr and "does not support different K (q8_0) and V (f16) cache types" in r.stderr


@pytest.mark.slow
def test_an_abort_in_the_dry_run_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    """Head size 80, one KV head, a q4_0 K without flash attention: llama.cpp
    aborts in ggml; the child dies, the caller gets llama.cpp's assertion."""
    path = write_gguf(tmp_path / "h80.gguf", SynthSpec(n_embd=160, n_head=2, n_head_kv=1, n_ff=320))
    dry = referee.dry_run(path, LoadConfig(n_ctx=256, type_k="q4_0", type_v="f16", flash_attn="off"))
    assert dry.refused is not None and "GGML_ASSERT" in dry.refused and not dry.ok


def test_a_dry_run_past_its_time_limit_gives_no_figure(smollm2: Path) -> None:
    dry = referee.dry_run(smollm2, LoadConfig(n_ctx=512), timeout=0.001)
    assert dry.failed is not None and "took over" in dry.failed and dry.buffers == {}


@pytest.mark.slow
def test_no_dry_run_says_so(smollm2: Path) -> None:
    d = _plan(str(smollm2), "--ctx", "1024", "--no-dry-run")
    assert d["dry_run"] is None and d["sources"]["compute"] == "graph replay"
    assert "llama.cpp's dry run: not run" in cli("plan", str(smollm2), "--ctx", "1024", "--no-dry-run").stdout


@pytest.mark.slow
def test_one_child_answers_the_dry_runs_of_a_process_and_an_abort_costs_only_its_own(tmp_path: Path) -> None:
    """The child stays for the next dry run (its start was most of each one); an
    abort ends it, and the next dry run starts another and gets its figures."""
    good = write_gguf(tmp_path / "deci.gguf", SynthSpec(arch="deci", name="synthetic-deci", n_embd=128, n_head=4, kv_heads_per_layer=(4, 1)))
    first = referee.dry_run(good, LoadConfig(n_ctx=256))
    pid = referee.child_pid()
    second = referee.dry_run(good, LoadConfig(n_ctx=1024))
    assert first.ok and second.ok and pid is not None and referee.child_pid() == pid
    assert second.total("compute") > first.total("compute")  # each request's own config, not the first one's answer again
    bad = write_gguf(tmp_path / "h80.gguf", SynthSpec(n_embd=160, n_head=2, n_head_kv=1, n_ff=320))
    aborted = referee.dry_run(bad, LoadConfig(n_ctx=256, type_k="q4_0", type_v="f16", flash_attn="off"))
    assert aborted.refused is not None and "GGML_ASSERT" in aborted.refused and referee.child_pid() is None
    again = referee.dry_run(good, LoadConfig(n_ctx=1024))
    assert again.buffers == second.buffers and referee.child_pid() not in (None, pid)


@pytest.mark.slow
def test_an_idle_child_ends_and_the_next_dry_run_starts_another(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(referee, "IDLE_S", 0.2)
    referee._close()  # a child started with the usual idle time may be there
    try:
        assert referee.dry_run(smollm2, LoadConfig(n_ctx=512)).ok
        pid = referee.child_pid()
        deadline = time.monotonic() + 10
        while referee.child_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert referee.child_pid() is None, "the idle child did not end"
        assert referee.dry_run(smollm2, LoadConfig(n_ctx=512)).ok and referee.child_pid() not in (None, pid)
    finally:
        referee._close()  # its 0.2 s idle time would go on to the next test's dry runs


def test_a_child_that_ended_as_the_request_came_is_replaced_once(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle child may end (exit 0, no answer) just as a request is written: the
    request goes to a new child. A child that ends so twice is reported, not retried forever."""
    import subprocess
    import sys

    real = referee._start
    started: list[int] = []

    def gone_then_real(idle: float) -> subprocess.Popen:
        started.append(1)
        if len(started) == 1:
            return subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        return real(idle)

    referee._close()
    monkeypatch.setattr(referee, "_start", gone_then_real)
    try:
        assert referee.dry_run(smollm2, LoadConfig(n_ctx=512)).ok and len(started) == 2
        referee._close()
        monkeypatch.setattr(referee, "_start", lambda idle: subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE,
                                                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0))
        dry = referee.dry_run(smollm2, LoadConfig(n_ctx=512))
        assert dry.failed is not None and not dry.ok
    finally:
        referee._close()


@pytest.mark.slow
def test_a_dry_run_over_workers_gets_a_child_of_its_own(smollm2: Path) -> None:
    """llama.cpp keeps its RPC connections for the life of a process: a worker
    restarted on the same port must meet a new one, so the warm child is not used."""
    assert referee.dry_run(smollm2, LoadConfig(n_ctx=512)).ok
    pid = referee.child_pid()
    dry = referee.dry_run(smollm2, LoadConfig(n_ctx=512, rpc_servers=("127.0.0.1:9",)))
    assert dry.failed is not None and "127.0.0.1:9" in dry.failed
    assert referee.child_pid() == pid


@pytest.mark.slow
def test_a_forked_process_starts_a_child_of_its_own(smollm2: Path) -> None:
    """A fork inherits the warm child's pipes: two writers on one child would mix
    their requests, so the fork starts its own and the parent keeps its one."""
    import multiprocessing

    assert referee.dry_run(smollm2, LoadConfig(n_ctx=512)).ok
    pid = referee.child_pid()

    def in_the_fork(q) -> None:
        dry = referee.dry_run(smollm2, LoadConfig(n_ctx=512))
        q.put((dry.ok, referee.child_pid()))
        referee._close()

    q = multiprocessing.get_context("fork").Queue()
    p = multiprocessing.get_context("fork").Process(target=in_the_fork, args=(q,))
    p.start()
    ok, forked_child = q.get(timeout=60)
    p.join(60)
    assert ok and forked_child not in (None, pid)
    assert referee.dry_run(smollm2, LoadConfig(n_ctx=1024)).ok and referee.child_pid() == pid
