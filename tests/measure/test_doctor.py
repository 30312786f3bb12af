"""``localllm doctor``: measured timings, the roofline, a bottleneck and ranked actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.measure.roofline import measure_bandwidth, roofline
from localllm.plan.hardware import apple_bandwidth, nvidia_bandwidth
from tests.helpers.cli import cli


def test_roofline_arithmetic() -> None:
    r = roofline(50e9, weights_bytes=400_000_000, kv_bytes=100_000_000, measured=60.0)
    assert r.bytes_per_token == 500_000_000 and r.ceiling_tokens_per_s == pytest.approx(100.0)
    assert r.efficiency == pytest.approx(0.6)


def test_roofline_splits_bytes_between_ram_and_gpu_memory() -> None:
    # 300 MB from RAM at 50 GB/s (6 ms) + 200 MB from VRAM at 400 GB/s (0.5 ms): 6.5 ms a token
    r = roofline(50e9, weights_bytes=450_000_000, kv_bytes=50_000_000, measured=100.0, gpu_bytes=200_000_000, gpu_bandwidth=400e9)
    assert r.cpu_bytes_per_token == 300_000_000
    assert r.ceiling_tokens_per_s == pytest.approx(1 / 0.0065)
    # a GPU part whose bandwidth is unknown: no ceiling, no efficiency (n/a, not a guess)
    unknown = roofline(50e9, weights_bytes=450_000_000, kv_bytes=0, measured=100.0, gpu_bytes=200_000_000)
    assert unknown.ceiling_tokens_per_s is None and unknown.efficiency is None
    assert unknown.to_dict()["efficiency"] is None


def test_gpu_bandwidth_from_nvml_figures_matches_published_specs() -> None:
    # what NVML reports (bus width in bits, max memory clock in MHz) against the
    # vendors' spec sheets: RTX 4060 Laptop 256 GB/s, RTX 3060 Laptop 336 GB/s
    assert nvidia_bandwidth(128, 8001) == pytest.approx(256e9, rel=0.001)
    assert nvidia_bandwidth(192, 7001) == pytest.approx(336e9, rel=0.001)
    assert apple_bandwidth("Apple M2 Pro") == 200e9 and apple_bandwidth("Apple M9 Hyper") is None


@pytest.mark.slow
def test_bandwidth_is_measured_against_a_plain_copy() -> None:
    """Our figure against an independent one: a plain bytes copy timed here. The
    streaming measure must not come out below it (it would make every decode
    look faster than its ceiling)."""
    import time

    buf = bytearray(64 * 1024 * 1024)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        bytes(buf)
        best = min(best, time.perf_counter() - t0)
    plain = 2 * len(buf) / best
    ours = measure_bandwidth(mib=64, passes=3)
    assert ours >= 0.7 * plain, (ours / 1e9, plain / 1e9)
    two = measure_bandwidth(mib=64, passes=3, threads=2)
    assert two > 0


@pytest.mark.slow
def test_prompt_file_errors(tmp_path: Path) -> None:
    proc = cli("doctor", "--prompt-file", str(tmp_path / "nope.txt"))
    assert proc.returncode == 1 and "prompt file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_doctor_json(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Explain what a KV cache is, in detail. " * 10)  # 126 tokens: prefill is measured, and cheap
    proc = cli("doctor", "--prompt-file", str(prompt), "--gen-tokens", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    for key in ("bottleneck", "ttft_ms", "itl_p50_ms", "prompt_tokens", "bandwidth_gb_per_s", "decode_ceiling_tokens_per_s", "decode_efficiency", "actions"):
        assert key in d, key
    assert d["bottleneck"] in ("prefill", "decode")
    assert d["prompt_tokens"] > 100 and d["generated_tokens"] == 16
    # bandwidth measured with the decode's own threads, and reported per thread count
    threads = d["settings"]["threads"]
    assert set(d["bandwidth_by_threads_gb_per_s"]) == {"1", str(threads)} or set(d["bandwidth_by_threads_gb_per_s"]) == {1, threads}
    assert d["bandwidth_gb_per_s"] == pytest.approx(d["bandwidth_by_threads_gb_per_s"].get(str(threads), d["bandwidth_by_threads_gb_per_s"].get(threads)))
    # above 1.0 would mean decode ran faster than memory can feed it: the model of the machine is wrong
    assert d["decode_ceiling_tokens_per_s"] > 0 and 0 < d["decode_efficiency"] <= 1.0, d
    assert d["bytes_per_token"] > 60 * 1024 * 1024  # SmolLM2 Q4_1 reads ~90 MiB of weights per token
    # issue 50 item 4: the machine's load before the measurement, and decode measured on each nearby count
    load = d["contention"]
    assert load["cores"] >= 1 and load["line"].startswith("run queue") and isinstance(load["busy"], bool)
    rates = {int(n): t for n, t in d["decode_by_threads_tokens_per_s"].items()}
    assert {1, threads} <= set(rates) and all(t > 0 for t in rates.values())
    assert 1 <= len(d["actions"]) <= 3 and all(a["action"] and a["expected"] for a in d["actions"])
    assert all(a["basis"] in ("measured", "derived", "rule of thumb") for a in d["actions"])
    assert d["kv_q8_0_kl_mean"] is not None and 0 < d["kv_q8_0_kl_mean"] < 0.2
    kv = d["kv_types"]
    assert set(kv) == {"f16", "q8_0", "q4_0"} and kv["q4_0"]["max_ctx"] >= kv["q8_0"]["max_ctx"] >= kv["f16"]["max_ctx"] > 0
    assert 0 < kv["q8_0"]["kl_mean"] < kv["q4_0"]["kl_mean"]  # measured: the smaller cache costs more
    # issue 50 item 4: tune is advised, by name, while this model has no tuned settings here
    assert d["tune"] == {"tuned": None, "advice": "localllm tune smollm2", "line": d["tune"]["line"]} and "flash attention" in d["tune"]["line"]
    spec_actions = [a for a in d["actions"] if "--speculate" in a["action"]]
    # recommended only on a measured gain, and said to be measured
    assert all(a["basis"] == "measured" and d["speculative_gain"] > 1.0 for a in spec_actions)
    # issue 45 item 7: the memory check (what doctor's text prints) compares the figures its "plan" reports
    check, plan = d["memory_check"], d["plan"]
    assert check["ok"], check
    planned = {b["buffer"]: b["planned_bytes"] for b in check["buffers"]}
    assert planned["compute"] == plan["compute_cpu_bytes"] + plan["compute_gpu_bytes"] and planned["output"] == plan["output_cpu_bytes"]


@pytest.mark.slow
def test_doctor_over_a_worker_follows_the_placement(tmp_path: Path) -> None:
    """doctor --rpc on a machine without a GPU: the layers per device come from
    the placement (the worker's and the CPU's), no advice names a GPU, the
    offload advice names the worker that has room, the worker's reads get no
    invented bandwidth, and the memory check compares each device."""
    from tests.helpers.workers import WorkerProc

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Tell me a long story about a cat.")
    w = WorkerProc()
    try:
        proc = cli("doctor", "--rpc", str(w.ep), "--ngl", "12", "--prompt-file", str(prompt), "--gen-tokens", "8",
                       "--no-quality", "--threads", "1", "--json")
    finally:
        w.stop()
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    name = f"RPC0[{w.ep}]"
    devices = d["settings"]["devices"]
    assert [(x["name"], x["kind"], x["layers"], x["output_layer"]) for x in devices] == [(name, "rpc", 11, True), ("CPU", "cpu", 19, False)]
    assert d["settings"]["n_gpu_layers"] == 12
    assert not any("GPU" in a["action"] + a["expected"] + a["why"] for a in d["actions"])
    offload = [a for a in d["actions"] if a["action"].startswith("offload more layers")]
    assert len(offload) == 1 and name in offload[0]["action"] and offload[0]["basis"] == "rule of thumb"
    assert d["gpu_bytes_per_token"] > 0 and d["decode_ceiling_tokens_per_s"] is None and d["decode_efficiency"] is None
    mc = d["memory_check"]
    assert mc["ok"] is True and {b["buffer"] for b in mc["buffers"]} >= {f"{name} kv", f"{name} compute", "CPU kv", "CPU compute", "CPU output"}


def test_offload_advice_over_devices_needs_cpu_layers_and_room(smollm2: Path) -> None:
    """Offloading more is advised only while the CPU holds layers and a device
    of the placement has room for one more layer, by its name."""
    from localllm.measure.doctor import _offload_over_devices
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan.planner import MiB, ModelShape

    shape = ModelShape.from_header(read_header(smollm2))
    GiB = 1024 * MiB

    def s(cpu_layers: int, free: int | None) -> dict:
        return {"n_gpu_layers": 31 - cpu_layers, "devices": [
            {"name": "RPC0[a:1]", "kind": "rpc", "layers": 30 - cpu_layers, "output_layer": True, "total_bytes": 150 * MiB, "free_bytes": free},
            {"name": "CPU", "kind": "cpu", "layers": cpu_layers, "output_layer": False, "total_bytes": 40 * MiB, "free_bytes": 8 * GiB}]}

    assert _offload_over_devices(s(0, 8 * GiB), shape) == []  # everything is offloaded already
    assert _offload_over_devices(s(19, 280 * MiB), shape) == []  # the worker is full: 280 less 128 head-room less 150 in use
    assert _offload_over_devices(s(19, None), shape) == []  # free memory unknown: no advice
    [a] = _offload_over_devices(s(19, 8 * GiB), shape)
    assert a.action == "offload more layers to RPC0[a:1] (--ngl, now 12 of 31)" and "network" in a.expected


def test_tune_is_advised_until_the_model_is_tuned_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.commands.doctor import _tune_advice

    config = tmp_path / "config.toml"
    monkeypatch.setenv("LOCALLLM_CONFIG", str(config))
    assert _tune_advice("smollm2")["advice"] == "localllm tune smollm2"
    config.write_text('[models."smollm2"]\nubatch = 256\ntuned = { date = "2026-12-03 07:40", ubatch = 256 }\n')
    got = _tune_advice("SmolLM2")
    assert got["advice"] is None and got["tuned"] == {"date": "2026-12-03 07:40", "settings": {"ubatch": 256}, "partial": False}
    assert got["line"] == "tuned here: ubatch 256 (from tune, 2026-12-03 07:40); localllm tune SmolLM2 measures again"
    config.write_text('[models."smollm2"]\ntuned = "yesterday"\n')  # not what tune writes: advised again, not a crash
    assert _tune_advice("smollm2")["advice"] == "localllm tune smollm2"
