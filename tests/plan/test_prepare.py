"""One way in to a load (``plan.prepare.prepare_load``): where the graph replay
does not cover a model, llama.cpp's dry run gives the compute figure every
loading command budgets with and checks the load against; when llama.cpp needs
more than the estimate, the fit is redone so "fits" never rests on a figure
below llama.cpp's; a config it refuses is refused before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine_api import DryRun, LoadConfig
from localllm.errors import EngineError
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, planner, prepare
from localllm.plan.hardware import Hardware
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.cli import cli

MiB = 2**20
STEP = 0.006 * MiB  # llama.cpp prints MiB to two decimals


@pytest.fixture(scope="module")
def deci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An architecture the replay does not rebuild: its compute is an estimate."""
    d = tmp_path_factory.mktemp("deci")
    return write_gguf(d / "deci.gguf", SynthSpec(arch="deci", name="synthetic-deci", n_embd=128, n_head=4, kv_heads_per_layer=(4, 1)))


def _cpu(ram: int) -> Hardware:
    return Hardware(None, None, None, "none", ram, ram)


def _estimate(path: Path, n_ctx: int, ram: int = 2**40) -> prepare.LoadPlan:
    return prepare.prepare_load(path, fitting.Request(LoadConfig(n_ctx=n_ctx)), _cpu(ram), n_ctx=n_ctx, dry_run=None)


class ThreeTimes:
    """Stands for a llama.cpp that needs three times the estimated compute of
    whatever config it is asked about; records the configs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.asked: list[LoadConfig] = []

    def __call__(self, path: Path, config: LoadConfig) -> DryRun:
        self.asked.append(config)
        shape = planner.ModelShape.from_header(read_header(path))
        est = planner.plan_memory(shape, config)
        return DryRun({"CPU": {"compute": 3 * est.compute_bytes, "output": est.output_bytes}}, 0.01)


def test_a_compute_above_the_estimate_refits_to_llama_cpps_figure(deci: Path) -> None:
    asked = _estimate(deci, 4096)
    assert asked.compute_source == prepare.ESTIMATE and asked.fit.outcome is fitting.Outcome.FITS_AS_ASKED
    # RAM for the weights, the KV cache and twice the estimated compute: the
    # estimate fits, three times it does not
    ram = asked.total[1] + asked.compute[1]
    assert _estimate(deci, 4096, ram).fit.outcome is fitting.Outcome.FITS_AS_ASKED
    referee = ThreeTimes(deci)
    lp = prepare.prepare_load(deci, fitting.Request(LoadConfig(n_ctx=4096)), _cpu(ram), n_ctx=4096, dry_run=referee)
    assert lp.refits == 1 and len(referee.asked) == 2 and referee.asked[0].n_ctx == 4096
    assert lp.fit.fits and lp.config.n_ctx < 4096 and referee.asked[1] == lp.config  # the new choice was dry-run too
    assert lp.compute_source == prepare.DRY_RUN and lp.compute[1] == 3 * _estimate(deci, lp.config.n_ctx).compute[1]
    assert lp.total[1] <= ram  # what is shown is what was budgeted
    assert "the fit was redone 1×" in lp.check_line()


def test_what_fits_only_by_the_estimate_does_not_fit(deci: Path) -> None:
    """A budget the estimate fits at a small context, and llama.cpp's figure at none."""
    ram = 7_000_000
    assert _estimate(deci, 4096, ram).fit.fits  # by the estimate: a smaller context fits
    lp = prepare.prepare_load(deci, fitting.Request(LoadConfig(n_ctx=4096)), _cpu(ram), n_ctx=4096, dry_run=ThreeTimes(deci))
    assert not lp.fit.fits and lp.refits == 1
    assert lp.skipped == "the request does not fit with llama.cpp's compute figure"


def test_a_refusal_is_raised_before_any_load_and_a_failed_dry_run_keeps_the_estimate(deci: Path) -> None:
    def refuses(path: Path, config: LoadConfig) -> DryRun:
        return DryRun(refused="K cache type q8_0 with block size 32 does not divide n_embd_head_k=80")

    def crashes(path: Path, config: LoadConfig) -> DryRun:
        return DryRun(failed="llama.cpp's dry run took over 60 s")

    with pytest.raises(EngineError, match="llama.cpp refuses this config: K cache type q8_0"):
        prepare.prepare_load(deci, fitting.Request(LoadConfig(n_ctx=1024)), _cpu(2**34), dry_run=refuses)
    lp = prepare.prepare_load(deci, fitting.Request(LoadConfig(n_ctx=1024)), _cpu(2**34), n_ctx=1024, dry_run=crashes)
    assert lp.compute_source == prepare.ESTIMATE and lp.compute == _estimate(deci, 1024).compute
    assert lp.check_line().startswith("llama.cpp's dry run: n/a (llama.cpp's dry run took over 60 s)")


def test_host_buffers_of_a_gpu_backend_count_as_ram() -> None:
    """On a CUDA or Metal build llama.cpp logs a pinned host compute buffer beside the device's."""
    dry = DryRun({"CUDA0": {"compute": 300}, "CUDA_Host": {"compute": 20, "output": 4}, "CPU": {"compute": 1}})
    assert dry.total("compute", cpu=False) == 300 and dry.total("compute", cpu=True) == 21 and dry.total("output", cpu=False) is None


@pytest.mark.slow
def test_several_sequences_in_one_cache_are_replayed_as_the_load_allocates(smollm2: Path) -> None:
    """serve's batch engine (4 sequences, a unified cache) is replayed (the graph's
    shapes are one sequence's; only the reserved ubatches change) with no dry run:
    its compute equals what a real load of the same config (n_seq_max 4, unified)
    allocates, and so does the output buffer, one row per sequence. Separate
    streams stay with llama.cpp's dry run."""
    from localllm.engine import LlamaCppBackend

    def no_dry_run(*_: object) -> DryRun:
        raise AssertionError("the replay covers a unified cache: no dry run")

    lp = prepare.prepare_load(smollm2, fitting.Request(LoadConfig()), _cpu(2**34), n_ctx=4096, n_seq=4, dry_run=no_dry_run)
    assert lp.compute_source == prepare.REPLAY and lp.config.n_seq == 4 and lp.config.kv_unified
    with LlamaCppBackend() as b:
        b.load(smollm2, lp.config)
        logged = b.logged_buffers["CPU"]
    assert abs(lp.compute[1] - logged["compute"][0] * MiB) <= STEP
    assert lp.output[1] == 4 * 49152 * 4 == round(logged["output"][0] * MiB)  # 4 rows of SmolLM2's 49,152 logits
    assert abs(lp.plan.output_bytes - logged["output"][0] * MiB) <= STEP  # the load is checked against what it logs at once


@pytest.mark.slow
def test_run_checks_the_load_against_the_refereed_figures(deci: Path) -> None:
    """``run`` on a model outside the replay: the load matches the plan within
    1% because the plan's compute is llama.cpp's; without the dry run the
    estimate (about 10% high on this model) is flagged."""
    args = ("run", str(deci), "--raw", "-p", "The capital", "-n", "2", "--temp", "0", "--ctx", "1024")
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["plan"]["sources"]["compute"] == prepare.DRY_RUN and out["plan"]["dry_run"]["buffers"]["CPU"]["compute"] > 0
    by = {b["buffer"]: b for b in out["memory_check"]["buffers"]}
    assert by["compute"]["ok"] and abs(by["compute"]["planned_bytes"] - by["compute"]["llama_bytes"]) <= STEP
    off = {b["buffer"]: b for b in json.loads(cli(*args, "--json", "--no-dry-run").stdout)["memory_check"]["buffers"]}
    assert not off["compute"]["ok"] and off["compute"]["planned_bytes"] > off["compute"]["llama_bytes"]


@pytest.mark.slow
def test_plan_shows_where_each_figure_came_from(smollm2: Path) -> None:
    d = json.loads(cli("plan", str(smollm2), "--ctx", "1024", "--json").stdout)
    assert d["sources"]["compute"] == prepare.REPLAY and d["dry_run"]["buffers"]["CPU"]["compute"] > 0 and d["refits"] == 0
    assert d["dry_run_skipped"] is None
    r = cli("plan", str(smollm2), "--ctx", "1024", "--no-dry-run", "--json")
    assert json.loads(r.stdout)["dry_run_skipped"] == "--no-dry-run"


def test_over_devices_each_compute_is_llama_cpps_and_a_device_it_overfills_is_named(deci: Path) -> None:
    """``--rpc``: the placement chose a split; llama.cpp's dry run gives each
    device's compute buffer, and a worker it puts over its budget fails the fit."""
    from localllm.plan.placement import Device

    worker = Device("RPC0[127.0.0.1:1]", "rpc", 2**30, 2**30)
    cpu = Device("CPU", "cpu", 2**34, 2**34)
    request = fitting.Request(LoadConfig(n_ctx=1024, rpc_servers=("127.0.0.1:1",)))

    def says(compute: int):
        def dry(path: Path, config: LoadConfig) -> DryRun:
            return DryRun({worker.name: {"compute": compute}, "CPU": {"compute": 1000, "output": 5000}}, 0.01)
        return dry

    lp = prepare.prepare_load(deci, request, _cpu(2**34), n_ctx=1024, devices=[worker], cpu=cpu, dry_run=says(3 * MiB))
    assert lp.fit.fits and [u.compute_bytes for u in lp.placement.uses] == [3 * MiB, 1000]
    assert lp.compute_source == prepare.DRY_RUN and lp.compute == (3 * MiB, 1000)
    lp = prepare.prepare_load(deci, request, _cpu(2**34), n_ctx=1024, devices=[worker], cpu=cpu, dry_run=says(2**30))
    assert not lp.fit.fits and lp.fit.sentence.startswith(f"with llama.cpp's compute buffers (its dry run) {worker.name} needs")


def test_a_simulated_gpu_budget_keeps_llama_cpps_compute_in_the_gpu_column(deci: Path) -> None:
    """On a build with no GPU llama.cpp logs only CPU buffers; under --vram the
    planner puts compute on the GPU, and llama.cpp's figure goes there."""
    def dry(path: Path, config: LoadConfig) -> DryRun:
        return DryRun({"CPU": {"compute": 7 * MiB, "output": 1000}}, 0.01)

    hw = Hardware("GPU", 4 * 2**30, None, "--vram", 2**34, 2**34)
    lp = prepare.prepare_load(deci, fitting.Request(LoadConfig(n_ctx=1024)), hw, n_ctx=1024, dry_run=dry)
    assert lp.fit.plan.compute_on_gpu and lp.compute == (7 * MiB, 0)
    assert lp.total[0] == lp.fit.plan.weights_gpu_bytes + lp.fit.plan.kv_gpu_bytes + 7 * MiB


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qwen2moe", "mamba2", "gpt-oss", "llama"])
def test_plan_json_reports_the_compute_its_table_shows(case: str, synth_case) -> None:
    """Issue 45 item 7: ``plan --json`` took the unrefereed plan (the estimate, with
    ``compute_estimated: true``) while ``sources.compute`` said "llama.cpp's dry run"
    and the table showed the dry run's figure. Now the JSON's compute_bytes is the
    table's, and ``compute_estimated`` is true only when nothing measured it."""
    import re

    path = synth_case(case)
    d = json.loads(cli("plan", str(path), "--json").stdout)
    text = cli("plan", str(path)).stdout
    shown = re.search(r"^compute \(([^)]+)\)\s+\S+ \S+\s+([\d.]+) (KiB|MiB|GiB)$", text, re.M)
    assert shown, text
    assert shown.group(1) == d["sources"]["compute"]
    scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[shown.group(3)]
    assert abs(d["compute_bytes"] / scale - float(shown.group(2))) < 0.006, (d["compute_bytes"], shown.group(0))
    assert d["compute_cpu_bytes"] == d["compute_bytes"]  # no GPU here: the CPU column is the whole figure
    assert d["compute_estimated"] is (d["sources"]["compute"] == "estimate")
