"""``localllm tune``: bad input is one line and nothing lost; the quick mode
measures, writes the section, and ``plan`` shows it; Ctrl+C at any step leaves
the config file untouched or with a valid partial section. The runs are on a
synthetic model paced like a small real one (``paced``): what is tested is what
tune decides and keeps, not SmolLM2's figures (a quick tune on SmolLM2 was 40 s
of the suite; docs/benchmarks.md gives its full tune's time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.measure import starved
from localllm.threads import topology
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli, one_line
from tests.helpers.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MINE = "# mine\nctx = 1024\n\n[run]\ntemp = 0.5\n"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    monkeypatch.setenv("LOCALLLM_CONFIG", str(path))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic model for the tests of tune's stops that do not race a real run (a machine
    turning busy, Ctrl+C in the quality check, both simulated in-process): they are about what
    is kept, not SmolLM2's figures, and a whole quick tune takes milliseconds on it where
    SmolLM2's took 20 s. (Ctrl+C at a step runs on ``paced``: its signal lands inside a run.)
    Heads of 64, so that q8_0 K and V fit their blocks."""
    return write_llama_gguf(tmp_path_factory.mktemp("tune") / "tiny.gguf", SynthSpec(n_embd=128, n_head=2, n_head_kv=1, n_ff=256))


def busy(cpu: float = 98.0) -> starved.Contention:
    return starved.Contention(cores=2, run_queue=2.5, running=2, busy_percent=99.0, steal_percent=0.0,
                              busiest=starved.Busy("yes", 4242, cpu))


@pytest.mark.parametrize("value, says", [("0", "--threads must be at least 1, got 0"), ("10000", "--threads must be at most")])
def test_a_thread_count_out_of_range_is_one_line(config: Path, value: str, says: str) -> None:
    one_line(cli("tune", "smollm2", "--threads", value), 2, says)
    assert config.read_text() == MINE


def test_a_busy_machine_is_refused_naming_the_program(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localllm.commands.tune.contention", lambda: busy())
    line = one_line(cli("tune", "smollm2", "--quick"), 1, "too busy to measure", "yes (pid 4242) is using 98% of a core", "--force")
    assert line.startswith("localllm: error:")
    assert config.read_text() == MINE


@pytest.mark.slow
def test_quick_tune_writes_a_section_plan_shows(config: Path, paced: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--force on a (simulated) busy machine warns and measures; a /sys that hides the CPU
    topology falls back and says so; every figure is in --json, and the section it writes is
    what plan then reports as tune's."""
    monkeypatch.setattr("localllm.commands.tune.contention", lambda: busy())
    real = topology.start_threads
    monkeypatch.setattr(topology, "start_threads", lambda: real(system="Linux", machine="x86_64", sysfs=tmp_path / "no-sys"))
    t0 = time.monotonic()
    r = cli("tune", str(paced), "--quick", "--force", "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "warning: measuring on a busy machine (--force): yes (pid 4242)" in r.stderr
    assert "the CPU topology is hidden" in r.stderr
    d = json.loads(r.stdout)
    assert d["quick"] and d["forced"] and d["offload"] == "no GPU: offload not tuned" and d["n_ctx"] == 1024  # the file's ctx: the one run uses
    stages = {s["setting"]: s for s in d["stages"]}
    assert list(stages) == ["flash-attn", "kv-type", "ubatch", "threads"]
    for key in ("flash-attn", "kv-type", "ubatch"):
        st = stages[key]
        assert st["complete"] and len(st["candidates"]) == 2 and sum(c["chosen"] for c in st["candidates"]) == 1, st
        for c in st["candidates"]:
            assert c["runs"] == 2 and all(v > 0 for v in c["prefill_tokens_per_s"].values()) and c["memory_bytes"]["total"] > 0
    kv = {c["value"]: c for c in stages["kv-type"]["candidates"]}
    assert kv["f16"]["kl_mean"] == 0.0 and kv["q8_0"]["kl_mean"] > 0 and 0 < kv["q8_0"]["top1_agreement"] <= 1
    assert kv["q8_0"]["memory_bytes"]["total"] < kv["f16"]["memory_bytes"]["total"]
    assert d["written"]["table"] == 'models."paced"' and set(d["chosen"]) >= {"flash-attn", "kv-type", "ubatch"}
    table = tomllib.loads(config.read_text())
    assert table["run"] == {"temp": 0.5} and config.read_text().startswith(MINE)
    entry = table["models"]["paced"]
    assert {k: entry[k] for k in d["chosen"]} == d["chosen"] and entry["tuned"]["date"]
    plan = cli("plan", str(paced), "--no-dry-run")
    assert plan.returncode == 0 and f"(from tune, {entry['tuned']['date']})" in plan.stdout
    print(f"quick tune: {took:.0f} s")


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic model whose tune runs take about 0.15 s each here (SmolLM2's took 1.5 s,
    and the Ctrl+C test at [9/ 36 s of the suite): long enough for a signal sent 0.05 s
    after a run's progress line to land inside that run, on any machine slower than this one."""
    return write_llama_gguf(tmp_path_factory.mktemp("paced") / "paced.gguf",
                            SynthSpec(n_layer=6, n_embd=512, n_head=8, n_head_kv=2, n_ff=1536, dtype="f16"))


def _start(config: Path, model: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "LOCALLLM_CONFIG": str(config)}
    return subprocess.Popen([sys.executable, "-m", "localllm", "tune", str(model), "--quick", "--force"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("point, kept", [("[1/", set()), ("[3/", {"flash-attn"}), ("[9/", {"flash-attn", "kv-type"})])
def test_ctrl_c_at_a_step_keeps_what_was_measured(config: Path, paced: Path, point: str, kept: set[str]) -> None:
    """SIGINT when the progress line shows ``point``: exit 130, one line saying what was kept, and the
    file either as it was (nothing decided) or with a valid partial section of the stages decided."""
    p = _start(config, paced)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if point in line:
            time.sleep(0.05)  # into the run that line announced
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=300)
    err = "".join(seen) + err
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "localllm: interrupted: kept what was measured" in err
    text = config.read_text()
    if not kept:
        assert text == MINE
        return
    entry = tomllib.loads(text)["models"]["paced"]  # parses: never a broken file
    assert text.startswith(MINE) and entry["tuned"]["partial"] is True
    assert set(entry["tuned"]) - {"date", "partial"} <= kept | {"threads"} and set(entry) - {"tuned"} <= kept
    assert "partly measured" in out  # the table of what was measured is shown
    assert cli("plan", str(paced), "--no-dry-run").returncode == 0


@pytest.mark.slow
def test_a_machine_that_becomes_busy_stops_the_tuning(config: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quiet at the start and after the first stage, busy after the second: one line naming the
    program, exit 1, and the section holds the first stage only (the second's figures were the load's)."""
    quiet = starved.Contention(cores=2, run_queue=0.1, running=0, busy_percent=3.0, steal_percent=0.0, busiest=None)
    answers = iter([quiet, quiet, busy()])
    monkeypatch.setattr("localllm.commands.tune.contention", lambda: next(answers))
    r = cli("tune", str(tiny), "--quick", "--threads", "1", "--json")
    line = one_line(r, 1, "became too busy to measure during the kv-type stage", "yes (pid 4242)", "flash-attn decided")
    assert "run tune again when it is quiet" in line
    entry = tomllib.loads(config.read_text())["models"][tiny.stem]
    assert set(entry) == {"flash-attn", "tuned"} and entry["tuned"]["partial"] is True


def test_ctrl_c_before_anything_is_measured(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt() -> starved.Contention:
        raise KeyboardInterrupt

    monkeypatch.setattr("localllm.commands.tune.contention", interrupt)
    one_line(cli("tune", "smollm2", "--quick"), 130, "interrupted before anything was measured: the config file is untouched")
    assert config.read_text() == MINE


@pytest.mark.slow
def test_ctrl_c_during_the_quality_check(config: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step between two stages' runs: the first stage stands, the cache stage has nothing to decide on."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("localllm.commands.tune.kv_cache_quality", interrupt)
    r = cli("tune", str(tiny), "--quick", "--force", "--threads", "1", "--json")
    assert r.returncode == 130 and "kept what was measured (flash-attn decided" in r.stderr, r.stderr
    d = json.loads(r.stdout)
    assert d["interrupted"] and d["written"]["partial"] and list(d["chosen"]) == ["flash-attn"]
    kv = next(s for s in d["stages"] if s["setting"] == "kv-type")
    assert kv["chosen"] is None and all(c["prefill_tokens_per_s"] is None and c["kl_mean"] is None for c in kv["candidates"])
    entry = tomllib.loads(config.read_text())["models"][tiny.stem]
    assert set(entry) == {"flash-attn", "tuned"} and entry["tuned"]["partial"] is True
