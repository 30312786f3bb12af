"""The GPU acceptance run (issue 28) cannot rot on a machine without a GPU:
``scripts/gpu_check.sh --dry`` checks a tarball's layout, rebuilds SmolLM2 from
its header, prints every step's command and runs ``gpu_compare.py --quick`` on
the CPU, where the plan and llama.cpp must agree on KV and compute."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GPU_CHECK = REPO / "scripts" / "gpu_check.sh"
ROWS = re.compile(r"^\| SmolLM2-135M \| full \| (f16|q8_0) \| 0 \| (.*) \| (yes|NO) \|$", re.M)


def _wheel(name: str, version: str, requires: Sequence[str] = ()) -> tuple[str, bytes]:
    """A minimal valid wheel: pip resolves it from its METADATA."""
    norm = re.sub(r"[-_.]+", "_", name).lower()
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{norm}-{version}.dist-info/METADATA", meta)
        z.writestr(f"{norm}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{norm}-{version}.dist-info/RECORD", "")
    return f"{norm}-{version}-py3-none-any.whl", buf.getvalue()


def _on_device(marker: str | None) -> bool:
    """Whether a requirement's environment marker holds on the device (CPython 3.12
    on Linux): the markers pyproject.toml uses, one comparison each."""
    if not marker:
        return True
    m = re.fullmatch(r";\s*(python_version|sys_platform)\s*(<|>=|==|!=)\s*['\"]([^'\"]+)['\"]\s*", marker)
    assert m, f"a marker this test cannot read: {marker}"
    key, op, want = m.groups()
    have: tuple | str = (3, 12) if key == "python_version" else "linux"
    value: tuple | str = tuple(int(x) for x in want.split(".")) if key == "python_version" else want
    return {"<": lambda: have < value, ">=": lambda: have >= value, "==": lambda: have == value, "!=": lambda: have != value}[op]()


def _tarball(path: Path, *, cuda: bool = True, drop: str = "") -> Path:
    """A tarball of gpu_check.sh's layout: stand-in source files, SmolLM2's real
    header (the device rebuilds the file from it), a localllm wheel with this
    checkout's requirements and one stand-in wheel per requirement (less
    ``drop``), at its least allowed version."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.store.resolver import resolve

    smol = Path(resolve("smollm2"))
    head = read_header(smol).data_offset
    src = "localllm-gpu/src/llama_cpp_python-0.3.36"
    files: dict[str, bytes] = {
        f"{src}/pyproject.toml": b"", f"{src}/llama_cpp/llama_cpp.py": b"", f"{src}/vendor/llama.cpp/CMakeLists.txt": b"",
        f"{src}/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp": b"",
        "localllm-gpu/models/SmolLM2-135M.head": smol.read_bytes()[:head],
        "localllm-gpu/models/models.tsv": f"SmolLM2-135M\t{smol.name}\t{smol.stat().st_size}\t{head}\n".encode(),
    }
    if cuda:
        files[f"{src}/vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt"] = b""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    name, data = _wheel("localllm", "0.1.0", deps)
    files[f"localllm-gpu/wheels/{name}"] = data
    for req in [*deps, "diskcache", "jinja2", "typing-extensions"]:
        m = re.match(r"([A-Za-z0-9_.-]+)([^;]*)(;.*)?$", req)
        assert m, req
        if m.group(1) in ("llama-cpp-python", drop) or not _on_device(m.group(3)):  # built there; left out; not for CPython 3.12 on Linux
            continue
        low = re.search(r">=\s*([\d.]+)", m.group(2))
        name, data = _wheel(m.group(1), low.group(1) if low else "1.0")
        files[f"localllm-gpu/wheels/{name}"] = data
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _dry(tarball: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PYTHON": sys.executable, "HOME": str(Path.home()),
           "GPU_CHECK_WORK": str(out.parent / "work")}  # not the checkout's build/gpu-check/work
    return subprocess.run(["bash", str(GPU_CHECK), "--dry", "--tarball", str(tarball)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


CUDA_LOG = """\
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:05.0) - 142582 MiB free
load_tensors: offloaded 31/31 layers to GPU
load_tensors:        CUDA0 model buffer size =    92.10 MiB
load_tensors:   CPU_Mapped model buffer size =    28.69 MiB
llama_kv_cache:      CUDA0 KV buffer size =    90.00 MiB
llama_context:  CUDA_Host  output buffer size =     0.19 MiB
llama_context:      CUDA0 compute buffer size =    17.51 MiB
llama_context:  CUDA_Host compute buffer size =     9.01 MiB
"""


def test_a_cuda_load_log_is_read_per_column() -> None:
    """The GPU path's parsing, checked here: CUDA0's buffers are the GPU's,
    CPU_Mapped's and the pinned CUDA_Host's the host's, and the free memory
    llama.cpp reports is kept with the device's name."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_compare
    finally:
        sys.path.remove(str(REPO / "scripts"))
    cols, devices, free = gpu_compare.read_log(CUDA_LOG.splitlines())
    assert cols == {"gpu": {"weights": 92.10, "kv": 90.00, "compute": 17.51, "output": 0.0},
                    "host": {"weights": 28.69, "kv": 0.0, "compute": 9.01, "output": 0.19}}
    assert set(devices) == {"CUDA0", "CPU", "CUDA_Host"}
    assert free == {"CUDA0": {"name": "NVIDIA H200", "free_mib": 142582}}


def test_gpu_check_is_valid_bash() -> None:
    for script in ("gpu_check.sh", "prepare_gpu_check.sh"):
        r = subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_tarball_without_the_cuda_backend_is_one_line(tmp_path: Path) -> None:
    r = _dry(_tarball(tmp_path / "t.tar.gz", cuda=False), tmp_path / "out")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "gpu_check.sh: the tarball lacks localllm-gpu/src/llama_cpp_python-[^/]*/vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt "
        "(remake it with scripts/prepare_gpu_check.sh)"]


@pytest.mark.slow
def test_dry_mode_prints_each_step_and_the_cpu_path_agrees(tmp_path: Path) -> None:
    """--dry on a tarball of the expected layout: each step's command with this
    GPU's architecture, the wheels resolved for CPython 3.12 with no index, and
    the CPU path on SmolLM2 rebuilt from its header (zero weights) agreeing with llama.cpp."""
    out = tmp_path / "out"
    r = _dry(_tarball(tmp_path / "t.tar.gz"), out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = r.stdout
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" in text, text
    assert r"-DGGML_CUDA_FA_QUANTS=f16-f16\;q8_0-q8_0" in text
    assert re.search(r"^\+ cmake --build \S+ -j \d+ --target llama llama-bench$", text, re.M)
    assert re.search(r"^\+ env CMAKE_ARGS=-DLLAMA_BUILD=OFF python3 -m pip wheel .*--no-index --no-build-isolation", text, re.M)
    assert re.search(r"^\+ python3 -m pip install .*--no-index .*--target \S+/site \S+/localllm-0.1.0-py3-none-any.whl", text, re.M)
    assert re.search(r"^\+ ln -s \S+/build/bin \S+/site/llama_cpp/lib$", text, re.M)
    assert re.search(r"^\+ cd \S+ && env PYTHONPATH=\S+ python3 \S+/scripts/gpu_compare.py --out \S+ --llama-bench \S+/llama-bench "
                     r"--model SmolLM2-135M=\S+$", text, re.M)
    assert re.search(r"^   SmolLM2-135M: \S+SmolLM2-135M-Instruct.Q4_1.gguf \(\d+ bytes, header \d+\)$", text, re.M)
    assert [(kv, ok) for kv, _, ok in ROWS.findall(text)] == [("f16", "yes"), ("q8_0", "yes")], text
    doc = json.loads((out / "gpu_compare.json").read_text())
    assert doc["note"].startswith("Models rebuilt on the device from their GGUF headers with zero weights")
    assert [r["ok"] for r in doc["rows"]] == [True, True]


@pytest.mark.slow
def test_dry_mode_names_a_dependency_the_wheels_lack(tmp_path: Path) -> None:
    r = _dry(_tarball(tmp_path / "t.tar.gz", drop="platformdirs"), tmp_path / "out")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "gpu_check.sh: the carried wheels do not hold localllm's dependencies "
        "(ERROR: No matching distribution found for platformdirs>=3)"], r.stderr
    assert not (tmp_path / "out" / "gpu_compare.json").exists()


@pytest.mark.slow
def test_gpu_compare_quick_agrees_with_llama_cpp_on_the_cpu(tmp_path: Path) -> None:
    """The CPU path: every buffer is the host's, and plan and llama.cpp agree on
    KV and compute within memcheck's tolerance, in both cache types."""
    from localllm.plan import memcheck

    r = subprocess.run([sys.executable, "scripts/gpu_compare.py", "--quick", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = ROWS.findall(r.stdout)
    assert [(kv, ok) for kv, _, ok in rows] == [("f16", "yes"), ("q8_0", "yes")], r.stdout
    assert "KV and compute within the memory check's tolerance: 2/2 loads" in r.stdout
    assert re.search(r"^\| SmolLM2-135M \| 16/4 \| [\d.]+ \| ", r.stdout, re.M), r.stdout  # bench vs llama-bench (or its error)
    assert (tmp_path / "gpu_compare.md").read_text().strip() in r.stdout
    doc = json.loads((tmp_path / "gpu_compare.json").read_text())
    assert {"gpu", "gpu_name", "n_ctx", "rows", "bench", "tolerance", "note", "quick", "seconds"} <= set(doc)
    assert doc["gpu"] is False and doc["quick"] is True and doc["tolerance"] == memcheck.TOLERANCE
    for row in doc["rows"]:
        assert {"model", "budget", "kv_type", "plan", "llama", "dry", "devices", "free", "agree", "ok"} <= set(row)
        assert set(row["devices"]) == {"CPU"}  # on the CPU, every buffer is the CPU's
        assert row["plan"]["gpu"] == dict.fromkeys(("weights", "kv", "compute", "output"), 0.0)
        for kind in ("kv", "compute"):
            plan, real = row["plan"]["host"][kind], row["llama"]["host"][kind]
            assert real > 0
            assert abs(plan - real) <= max(memcheck.TOLERANCE * real, 0.005), (row["kv_type"], kind, plan, real)
        assert row["dry"]["CPU"]["compute"] == pytest.approx(row["llama"]["host"]["compute"], abs=0.005)
