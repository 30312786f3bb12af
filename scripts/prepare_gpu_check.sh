#!/usr/bin/env bash
# Make the tarball scripts/gpu_check.sh needs on a lent NVIDIA machine (issue 28),
# which has no network: build/gpu-check/gpu-check.tar.gz (build/ is ignored: never
# in git), at most 60 MiB, since a device call carries 64 MiB in all.
#
#   scripts/prepare_gpu_check.sh          # prints the tarball's path and size
#
# It holds, under localllm-gpu/:
#   src/llama_cpp_python-0.3.36/   the pinned sdist (its vendored llama.cpp), trimmed
#                                  to what a CUDA build needs: no other backends,
#                                  docs, examples, tests, vocab files, .git
#   wheels/                        localllm's wheel and every dependency but
#                                  llama-cpp-python, for CPython 3.12 manylinux x86_64
#                                  (the device has some, and huggingface_hub 1.x
#                                  where localllm needs 2.x), plus diskcache
#                                  (llama-cpp-python's)
#   models/<label>.head, models.tsv
#                                  the two real models' GGUF headers (metadata and
#                                  tensor table, up to the data offset) and their
#                                  sizes: the 98 MB and 253 MB files cannot travel,
#                                  and every figure compared (weights, KV, compute,
#                                  output, speed) depends on the header alone, so the
#                                  device rebuilds each file at its size with zero
#                                  weights (gpu_check.sh; the table says so)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
limit_mib=60
out="$here/build/gpu-check"
stage="$out/stage/localllm-gpu"
tarball="$out/gpu-check.tar.gz"

die() { echo "prepare_gpu_check.sh: $*" >&2; exit 1; }
[ -x "$py" ] || die "no Python at $py (run scripts/install.sh, or set PYTHON)"

src_llama="$("$here/scripts/build_llama_tools.sh" --source)" || die "cannot fetch the llama-cpp-python $version source"
sdist="$(dirname "$(dirname "$src_llama")")"  # .../llama_cpp_python-<version>
[ -f "$sdist/pyproject.toml" ] || die "no sdist at $sdist"

rm -rf "$out/stage"
mkdir -p "$stage/src" "$stage/wheels" "$stage/models"

# 1. The source, trimmed (about 217 MiB unpacked before, 30 after)
tar -C "$(dirname "$sdist")" -cf - \
  --exclude=.git --exclude=docs --exclude=examples --exclude=tests --exclude=docker --exclude=media --exclude=benches \
  --exclude='ggml-vocab-*' --exclude="$(basename "$sdist")/vendor/llama.cpp/models" \
  --exclude=ggml-vulkan --exclude=ggml-sycl --exclude=ggml-opencl --exclude=ggml-metal --exclude=ggml-cann \
  --exclude=ggml-musa --exclude=ggml-hip --exclude=ggml-kompute --exclude=ggml-hexagon --exclude=ggml-webgpu \
  --exclude=ggml-openvino --exclude=ggml-et --exclude=ggml-virtgpu --exclude=ggml-zdnn --exclude=ggml-blas \
  --exclude=gguf-py --exclude=conversion --exclude='convert_*.py' --exclude=pocs --exclude=app --exclude=skills \
  --exclude=.devops --exclude=.github --exclude=ci \
  "$(basename "$sdist")" | tar -C "$stage/src" -xf -
# the backends' CMake lists are referenced (add_subdirectory when their option is
# on, never here); llama.cpp's top-level CMake adds models/ only for tests
for need in CMakeLists.txt vendor/llama.cpp/CMakeLists.txt vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt \
            vendor/llama.cpp/tools/llama-bench/llama-bench.cpp vendor/llama.cpp/tools/mtmd/CMakeLists.txt llama_cpp/llama_cpp.py; do
  [ -e "$stage/src/$(basename "$sdist")/$need" ] || die "the trimmed source lacks $need"
done

# 2. The wheels: localllm's dependencies (but llama-cpp-python, built there) for the device's Python
deps=("gguf>=0.17" "textual>=8.2.8,<8.3" "huggingface-hub>=2.0,<3" "httpx2>=2,<3" "filelock>=3.10" "rich>=13" "platformdirs>=3"
      "psutil>=5.9" "nvidia-ml-py>=12" "starlette>=0.40" "uvicorn>=0.30" "uvloop>=0.19" "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0")
# numpy too (16 MB): the device's own numpy 2.x is used where it satisfies (gpu_check.sh's venv sees it)
"$py" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$stage/wheels" "${deps[@]}" "numpy>=1.26" >/dev/null || die "pip download failed"
"$py" -m pip wheel --quiet --no-deps -w "$stage/wheels" "$here" >/dev/null || die "cannot build localllm's wheel"
ls "$stage/wheels"/localllm-*.whl >/dev/null 2>&1 || die "no localllm wheel built"

# 3. The two real models' headers and sizes
"$py" - "$stage/models" <<'EOF' || die "cannot read the real models' headers"
import os, sys
from pathlib import Path
from localllm.modelfile.gguf_file import read_header
from localllm.store.resolver import resolve

out = Path(sys.argv[1])
rows = []
for label, name in (("SmolLM2-135M", "smollm2"), ("Gemma3-270M", "gemma3-270m")):
    path = Path(resolve(name))
    head = read_header(path).data_offset
    with open(path, "rb") as f:
        (out / f"{label}.head").write_bytes(f.read(head))
    rows.append(f"{label}\t{path.name}\t{os.path.getsize(path)}\t{head}")
(out / "models.tsv").write_text("\n".join(rows) + "\n")
EOF

tar -C "$out/stage" -czf "$tarball" localllm-gpu
rm -rf "$out/stage"
bytes="$(stat -c %s "$tarball")"
mib="$(( (bytes + 1048575) / 1048576 ))"
echo "$tarball: $bytes bytes (${mib} MiB, limit ${limit_mib} MiB)"
if [ "$bytes" -gt $(( limit_mib * 1048576 )) ]; then
  die "the tarball is over ${limit_mib} MiB: a device call carries 64 MiB in all"
fi
