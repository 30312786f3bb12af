"""``localllm quantize`` through llama.cpp's own quantizer, on a real source:
SmolLM2 135M dequantized to F16, then quantized to Q8_0 and Q4_K_M. (Gemma 3
270M was the source until the suite's time was cut: its 262k-token vocabulary
made the three files' evaluation 100 s of the suite; SmolLM2's 49k, 20 s.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.modelfile.model_info import inspect_model
from localllm.quantize.naming import default_output
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.paths import REPO


def test_default_output_names() -> None:
    assert default_output(Path("m/smol-F16.gguf"), "Q4_K_M") == Path("m/smol-Q4_K_M.gguf")
    assert default_output(Path("m/smol.f16.gguf"), "Q8_0") == Path("m/smol-Q8_0.gguf")
    assert default_output(Path("gemma-3-270m-bf16.gguf"), "Q4_0") == Path("gemma-3-270m-Q4_0.gguf")
    assert default_output(Path("model.gguf"), "Q6_K") == Path("model-Q6_K.gguf")
    assert default_output(Path("llama-Q8_0.gguf"), "Q4_K_M") == Path("llama-Q4_K_M.gguf")


@pytest.fixture(scope="session")
def source_f16(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 135M Q4_1 dequantized to F16 by llama.cpp (requantize allowed)."""
    out = tmp_path_factory.mktemp("quant") / "smollm2-135m-F16.gguf"
    proc = cli("quantize", str(smollm2), str(out), "--type", "F16", "--allow-requantize", "--json")
    assert proc.returncode == 0, proc.stderr
    assert inspect_model(out).file_type == "F16"
    return out


@pytest.fixture(scope="session")
def quantized(source_f16: Path) -> dict[str, dict]:
    reports = {}
    for qtype in ("Q8_0", "Q4_K_M"):
        proc = cli("quantize", str(source_f16), "--type", qtype, "--json")
        assert proc.returncode == 0, proc.stderr
        reports[qtype] = json.loads(proc.stdout)
    return reports


@pytest.mark.slow
def test_outputs_match_their_reports_and_generate(source_f16: Path, quantized: dict[str, dict]) -> None:
    for qtype, rep in quantized.items():
        out = Path(rep["output"])
        assert out == source_f16.with_name(f"smollm2-135m-{qtype}.gguf")  # the ecosystem's naming, beside the input
        info = inspect_model(out)
        assert info.file_type == qtype == rep["type"]
        assert rep["output_bytes"] == out.stat().st_size and rep["input_bytes"] == source_f16.stat().st_size
        assert rep["bits_per_weight"] == info.bits_per_weight
        assert {t["type"]: t["count"] for t in rep["tensor_types"]} == {t.type: t.count for t in info.tensor_types}
        assert rep["seconds"] > 0
        proc = cli("run", str(out), "--raw", "-p", "The capital of France is", "-n", "6", "--temp", "0", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["generated_tokens"] == 6
    assert quantized["Q4_K_M"]["output_bytes"] < quantized["Q8_0"]["output_bytes"] < source_f16.stat().st_size


@pytest.mark.slow
def test_q8_loses_less_than_q4(source_f16: Path, quantized: dict[str, dict]) -> None:
    """--compare ranks by quality per GiB and gives each file a verdict in the
    bands of llama.cpp's published KL table (quantize/verdict.py), cited."""
    proc = cli("quantize", "--compare", str(source_f16), quantized["Q8_0"]["output"], quantized["Q4_K_M"]["output"],
                   "--eval-tokens", "256", "--json")  # one chunk of 256 (quantize/evaluate.py): 128 scored tokens
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    by = {Path(r["name"]).name: r for r in rows}
    q8, q4 = by["smollm2-135m-Q8_0.gguf"], by["smollm2-135m-Q4_K_M.gguf"]
    assert 0 < q8["kl_mean"] < q4["kl_mean"]
    assert q8["top1_agreement"] > q4["top1_agreement"] > 0.5
    assert q8["reference_perplexity"] == q4["reference_perplexity"] > 1
    assert [r["rank"] for r in rows] == [1, 2] and rows[0]["top1_percent_per_gib"] >= rows[1]["top1_percent_per_gib"]
    for r in (q8, q4):
        v = r["verdict"]
        assert v["source"].startswith("llama.cpp tools/perplexity/README.md") and v["text"].startswith(v["qtype"] + ": " + v["band"])
        assert "M-parameter model loses more than an 8B one" in v["text"]
    assert q8["verdict"]["qtype"] == "Q8_0" and q4["verdict"]["qtype"] == "Q4_K_M"
    bands = ["near-lossless", "small loss", "moderate loss", "large loss", "severe loss"]
    assert bands.index(q8["verdict"]["band"]) <= bands.index(q4["verdict"]["band"])


@pytest.mark.slow
def test_compare_as_text_with_its_progress(tmp_path: Path) -> None:
    """The text table, the verdict and the progress lines: on a tiny synthetic F32
    file and its Q4_K_M (what is checked here is the output, not a real model's
    quality: test_q8_loses_less_than_q4 holds that)."""
    src = write_llama_gguf(tmp_path / "synth-F32.gguf", SynthSpec(n_embd=256, n_ff=512))
    made = cli("quantize", str(src), "--type", "Q4_K_M", "--json")
    assert made.returncode == 0, made.stderr
    text = cli("quantize", "--compare", str(src), json.loads(made.stdout)["output"], "--eval-tokens", "256")
    assert text.returncode == 0, text.stderr
    assert "Q4_K_M: " in text.stdout and "bands: llama.cpp tools/perplexity/README.md" in text.stdout
    # piped, the progress is plain lines on stderr: where it starts and where it ends
    lines = [line for line in text.stderr.splitlines() if line.startswith("evaluating")]
    assert len(lines) >= 2 and "100%" in lines[-1] and "chunks" in lines[-1], text.stderr


def test_verdict_bands_follow_llama_cpps_table() -> None:
    """The boundaries sit just above the types llama.cpp measured (LLaMA 3 8B mean KLD)."""
    from localllm.quantize.verdict import judge

    measured = {"Q8_0": 0.001355, "Q6_K": 0.005452, "Q5_K_M": 0.010762, "Q4_K_M": 0.031273, "Q4_0": 0.071940, "Q3_K_M": 0.101913,
                "Q3_K_S": 0.228217}
    bands = {q: judge(q, kl, 0.9).band for q, kl in measured.items()}
    assert bands == {"Q8_0": "near-lossless", "Q6_K": "small loss", "Q5_K_M": "small loss", "Q4_K_M": "moderate loss",
                     "Q4_0": "large loss", "Q3_K_M": "large loss", "Q3_K_S": "severe loss"}
    assert "Q4_K_M is usually the better 4-bit choice" in judge("Q4_0", 0.072, 0.56).text
    assert "loses more" not in judge("Q4_K_M", 0.03, 0.9, n_params=8_000_000_000).text


@pytest.mark.slow
def test_dry_run_writes_nothing(source_f16: Path, quantized: dict[str, dict], tmp_path: Path) -> None:
    out = tmp_path / "dry-Q4_K_M.gguf"
    proc = cli("quantize", str(source_f16), str(out), "--type", "Q4_K_M", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert not out.exists() and not list(tmp_path.iterdir())
    # The dry run predicts the file: tensor data, the header (the 49k-token vocabulary) and padding.
    real = quantized["Q4_K_M"]["output_bytes"]
    assert abs(d["output_bytes"] - real) <= 0.01 * real, (d["output_bytes"], real)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--type", "Q3_XYZ"], "unknown quantization type 'Q3_XYZ'"),
        (["OUT_IS_INPUT", "--type", "Q8_0"], "would overwrite the input"),
    ],
)
def test_refusals(source_f16: Path, extra: list[str], needle: str) -> None:
    extra = [str(source_f16) if e == "OUT_IS_INPUT" else e for e in extra]
    before = source_f16.stat().st_mtime_ns
    proc = cli("quantize", str(source_f16), *extra)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert source_f16.stat().st_mtime_ns == before


@pytest.mark.slow
def test_existing_output_needs_force(source_f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.gguf"
    out.write_text("something the user had")
    proc = cli("quantize", str(source_f16), str(out), "--type", "Q8_0")
    assert proc.returncode == 2 and "pass --force" in proc.stderr
    assert out.read_text() == "something the user had"


def test_quantized_input_needs_allow_requantize(smollm2: Path, tmp_path: Path) -> None:
    proc = cli("quantize", str(smollm2), str(tmp_path / "x.gguf"), "--type", "Q4_0")
    assert proc.returncode == 2 and "already quantized (Q4_1)" in proc.stderr
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.slow
def test_bad_input_files(tmp_path: Path) -> None:
    (tmp_path / "notes.gguf").write_text("not a model")
    for path, needle in ((tmp_path / "missing.gguf", "not found"), (tmp_path / "notes.gguf", "not a GGUF file")):
        proc = cli("quantize", str(path), "--type", "Q8_0")
        assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_interrupt_leaves_nothing(source_f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "interrupted-Q8_0.gguf"
    proc = subprocess.Popen([sys.executable, "-m", "localllm", "quantize", str(source_f16), str(out), "--type", "Q8_0"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "quantizing: 1/236 tensors": the writing has begun
    assert line.startswith("quantizing"), line
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, rest
    assert "interrupted" in rest and "Traceback" not in rest
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_not_enough_disk_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free-space check runs before any byte is written. No root needed: the
    free-space query answers 1 MiB (the dry run itself runs in its child)."""
    import shutil
    from collections import namedtuple

    from localllm.errors import InputError
    from localllm.quantize.pipeline import Job, run
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    src = write_llama_gguf(tmp_path / "src-F16.gguf", SynthSpec(n_embd=256, n_ff=512, dtype="f16"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(1 << 30, (1 << 30) - (1 << 20), 1 << 20))
    with pytest.raises(InputError, match=r"free in .*GiB"):
        list(run(Job(src, out_dir / "out-Q8_0.gguf", "Q8_0")))
    assert list(out_dir.iterdir()) == []


@pytest.mark.slow
def test_imatrix_guides_the_quantizer(tmp_path: Path) -> None:
    """An importance matrix in llama-imatrix's GGUF layout (sums of squares and
    counts per weight) is read and handed to llama.cpp: a skewed one changes the
    rounding, so the output differs from the plain Q4_K_M. On a synthetic F32
    model (the rounding is what changes, not a real model's text): SmolLM2's two
    Q4_K_M quantizations took 8-19 s here."""
    import gguf
    import numpy as np

    from localllm.modelfile.gguf_file import read_header

    source_f16 = write_llama_gguf(tmp_path / "synth-F32.gguf", SynthSpec(n_embd=256, n_ff=512))
    made = cli("quantize", str(source_f16), str(tmp_path / "plain-Q4_K_M.gguf"), "--type", "Q4_K_M", "--json")
    assert made.returncode == 0, made.stderr
    rng = np.random.default_rng(0)
    path = tmp_path / "imatrix.gguf"
    w = gguf.GGUFWriter(str(path), "imatrix")
    for t in read_header(source_f16).tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            w.add_tensor(f"{t.name}.in_sum2", (rng.random(t.shape[0]) ** 4 * 100).astype(np.float32))
            w.add_tensor(f"{t.name}.counts", np.array([10.0], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "im-Q4_K_M.gguf"
    proc = cli("quantize", str(source_f16), str(out), "--type", "Q4_K_M", "--imatrix", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert inspect_model(out).file_type == "Q4_K_M"
    plain = Path(json.loads(made.stdout)["output"])
    assert out.stat().st_size == plain.stat().st_size and out.read_bytes() != plain.read_bytes()
