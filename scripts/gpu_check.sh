#!/usr/bin/env bash
# The GPU acceptance run (issue 28), from the repository root on a lent NVIDIA
# machine (no network) with build/gpu-check/gpu-check.tar.gz carried
# (scripts/prepare_gpu_check.sh makes it). Writes gpu_compare.md, gpu_compare.json
# and gpu_compare.log under $OUT (the run call in docs/development.md tees the whole log there too).
#
#   scripts/gpu_check.sh                 # on the device: build, install, compare
#   scripts/gpu_check.sh --dry           # here / CI: every step checked and printed, nothing built;
#                                        # the tarball unpacked and its layout checked, the models
#                                        # rebuilt from their headers, gpu_compare.py --quick on the CPU
#   scripts/gpu_check.sh --tarball PATH  # another tarball (GPU_CHECK_WORK: another work folder)
#
# Where the five minutes go (16 cores; estimates until the first run replaces them):
#   unpack 20 MiB, rebuild the two models from their headers   ~5 s
#   the carried wheels installed (--target), no network          ~20 s
#   cmake configure (CUDA toolkit probe)                         ~15 s
#   llama.cpp with CUDA for this GPU's architecture only         ~150-200 s  (ggml-cuda's kernels: most of it;
#     one build serves both llama-cpp-python (its lib/ links to it) the flash-attention kernels only for the
#     and llama-bench: the same source, flags and objects)          cache types the plan uses, f16 and q8_0)
#   llama-cpp-python's Python package on those libraries         ~5 s
#   gpu_compare.py: 2 models x 3 offloads x 2 caches, each a dry
#     run and a real load, then bench vs llama-bench            ~40 s
# A second run on the same machine (warm) reuses build/gpu-check/work/build: about a minute.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
dry=0
tarball="build/gpu-check/gpu-check.tar.gz"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) dry=1 ;;
    --tarball) [ $# -ge 2 ] || { echo "gpu_check.sh: --tarball needs a path" >&2; exit 2; }; tarball="$2"; shift ;;
    *) echo "gpu_check.sh: unknown option $1 (use --dry, --tarball PATH)" >&2; exit 2 ;;
  esac
  shift
done

work="${GPU_CHECK_WORK:-$here/build/gpu-check/work}"  # build/ is ignored
out="${OUT:-$here/build/gpu-check/out}"
jobs="$(nproc)"
t0="$(date +%s)"

die() { echo "gpu_check.sh: $*" >&2; exit 1; }
step() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
# print a command; run it unless --dry
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$dry" = 0 ]; then "$@"; fi
}
# a tool the device has: required there; here (--dry) its absence is said, not fatal
need() {
  if command -v "$1" >/dev/null 2>&1; then echo "   $1: $(command -v "$1")"
  elif [ "$dry" = 1 ]; then echo "   $1: absent here (the device has it)"
  else die "$1 is missing on this machine"; fi
}

step "tarball $tarball"
[ -f "$tarball" ] || die "no $tarball: run scripts/prepare_gpu_check.sh here and carry build/gpu-check"
listing="$(tar tzf "$tarball")" || die "$tarball is not a readable tar.gz"
for want in 'localllm-gpu/src/llama_cpp_python-[^/]*/pyproject.toml' 'localllm-gpu/src/llama_cpp_python-[^/]*/llama_cpp/llama_cpp.py' \
            'localllm-gpu/src/llama_cpp_python-[^/]*/vendor/llama.cpp/CMakeLists.txt' \
            'localllm-gpu/src/llama_cpp_python-[^/]*/vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt' \
            'localllm-gpu/src/llama_cpp_python-[^/]*/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp' \
            'localllm-gpu/wheels/localllm-[^/]*\.whl' 'localllm-gpu/models/models.tsv'; do
  grep -qx "$want" <<<"$listing" || die "the tarball lacks $want (remake it with scripts/prepare_gpu_check.sh)"
done
for dep in gguf textual httpx2 starlette uvicorn huggingface_hub diskcache; do
  grep -q "^localllm-gpu/wheels/${dep}-[^/]*\.whl$" <<<"$listing" || die "the tarball has no $dep wheel"
done
echo "   layout as expected: llama.cpp source, $(grep -c '\.whl$' <<<"$listing") wheels, models.tsv"

step "unpack into $work"
# all but build/: a second run on the same (still warm) machine reuses the CUDA
# build, since tar restores the sources' times and ninja finds nothing to redo
if [ -d "$work" ]; then find "$work" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +; fi
mkdir -p "$work" "$out"
tar xzf "$tarball" -C "$work"
root="$work/localllm-gpu"
src="$(echo "$root"/src/llama_cpp_python-*)"
llama_src="$src/vendor/llama.cpp"

step "models rebuilt from their headers (zero weights: every figure compared depends on the header alone)"
model_args=()
while IFS=$'\t' read -r label file size head; do
  [ -n "$label" ] || continue
  case "$size$head" in *[!0-9]*|"") die "models.tsv: bad sizes for $label" ;; esac
  [ "$(stat -c %s "$root/models/$label.head")" = "$head" ] || die "models/$label.head is not $head bytes"
  cp "$root/models/$label.head" "$work/$file"
  truncate -s "$size" "$work/$file"
  model_args+=(--model "$label=$work/$file")
  echo "   $label: $work/$file ($size bytes, header $head)"
done <"$root/models/models.tsv"
[ "${#model_args[@]}" -gt 0 ] || die "models.tsv names no model"

step "tools"
for t in cmake ninja nvcc nvidia-smi python3; do need "$t"; done
if [ "$dry" = 0 ]; then
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')"
  name="$(nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader | head -1)"
else
  cap="9.0"; name="(dry: an H200 would say 9.0)"
fi
case "$cap" in [0-9]*.[0-9]*) ;; *) die "nvidia-smi gave no compute capability ('$cap')" ;; esac
arch="${cap/./}"
echo "   GPU: $name; compute capability $cap -> CMAKE_CUDA_ARCHITECTURES=$arch"

flags=""
if [ "$(uname -m)" = "x86_64" ]; then flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi  # as scripts/install.sh

# cuBLAS: ggml-cuda links it. A toolkit assembled from NVIDIA's pip packages (as
# on this workplace's images: /usr/local/cuda-13.0 holds nvcc and cudart, no
# cuBLAS) has it in python3's nvidia/cu13 (nvidia-cublas) instead: point CMake
# at that library and header, and the loader at that folder.
# the toolkit: the first of these with a real bin/nvcc (/usr/local/bin/nvcc may be a wrapper script)
toolkit=/usr/local/cuda
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-* \
         "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")"; do
  if [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && [ -f "$c/include/cuda_runtime.h" ]; then toolkit="$c"; break; fi
done
echo "   CUDA toolkit: $toolkit"
cublas_dir=""
if [ -f "$toolkit/include/cublas_v2.h" ] || [ -f "$toolkit/targets/x86_64-linux/include/cublas_v2.h" ]; then
  echo "   cuBLAS: in the toolkit ($toolkit)"
else
  for d in $(python3 -c 'import sys; print(" ".join(p for p in sys.path if p))' 2>/dev/null); do
    for c in "$d/nvidia/cu13" "$d/nvidia/cublas" "$d/nvidia/cu12"; do
      if [ -z "$cublas_dir" ] && [ -f "$c/include/cublas_v2.h" ] && ls "$c/lib"/libcublas.so* >/dev/null 2>&1; then cublas_dir="$c"; fi
    done
  done
  if [ -n "$cublas_dir" ]; then
    echo "   cuBLAS: not in the toolkit ($toolkit); python3's $cublas_dir"
  elif [ "$dry" = 1 ]; then
    echo "   cuBLAS: not found here (the device has it in the toolkit or in python3's nvidia-cublas)"
  else
    die "no cuBLAS: neither in the CUDA toolkit ($toolkit) nor in python3's nvidia-cublas package"
  fi
fi
cublas_args=()
if [ -n "$cublas_dir" ]; then
  cublas_args=("-DCUDA_cublas_LIBRARY=$(ls "$cublas_dir"/lib/libcublas.so* | head -1)"
               "-DCUDA_cublasLt_LIBRARY=$(ls "$cublas_dir"/lib/libcublasLt.so* | head -1)"
               "-DCMAKE_CUDA_FLAGS=-I$cublas_dir/include")
  flags="$flags -I$cublas_dir/include"
  export LD_LIBRARY_PATH="$cublas_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# libcuda (CUDA::cuda_driver): the toolkit's stub, else the driver's own library
# (the driver's folder is mounted read-only there, often with libcuda.so.1 alone)
for c in "$toolkit/lib64/stubs/libcuda.so" "$toolkit/targets/x86_64-linux/lib/stubs/libcuda.so" \
         /usr/local/nvidia/lib64/libcuda.so /usr/local/nvidia/lib64/libcuda.so.1 \
         "$(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF; exit}')"; do
  if [ -n "$c" ] && [ -e "$c" ]; then cublas_args+=("-DCUDA_cuda_driver_LIBRARY=$c"); echo "   libcuda: $c"; break; fi
done

# GGML_CUDA_FA_QUANTS: flash-attention kernels for the K-V cache types the plan
# uses (f16 and q8_0, same type for K and V); GGML_CUDA_FA_ALL_QUANTS would
# compile all 49 pairs, minutes more, for pairs no row here loads.
cmake_args=(-S "$llama_src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" "-DGGML_CUDA_FA_QUANTS=f16-f16;q8_0-q8_0" -DGGML_RPC=ON
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" "${cublas_args[@]}")

step "llama.cpp for sm_$arch (one build: the library llama-cpp-python loads, and llama-bench)"
run cmake "${cmake_args[@]}"
run cmake --build "$work/build" -j "$jobs" --target llama llama-bench
if [ "$dry" = 1 ] && command -v cmake >/dev/null; then
  # the trimmed tree configures (every add_subdirectory there), CPU backend: a
  # CUDA configure needs the device's cuBLAS and libcuda
  cpu_args=()
  for x in "${cmake_args[@]}"; do
    case "$x" in -DGGML_CUDA=ON) cpu_args+=(-DGGML_CUDA=OFF) ;; -B) ;; "$work/build") cpu_args+=(-B "$work/build-dry") ;; *) cpu_args+=("$x") ;; esac
  done
  cmake "${cpu_args[@]}" >"$work/configure-dry.log" 2>&1 || die "the trimmed source does not configure: $(grep -m1 -A2 'CMake Error' "$work/configure-dry.log" | tr '\n' ' ')"
  echo "   dry: the trimmed source configures (CPU backend; $work/configure-dry.log)"
fi
lib="$work/build/bin"

step "Python: llama-cpp-python on the libraries just built, localllm and the carried wheels, into $work/site"
# Not a venv: the device's python3 is itself a venv (PyTorch's), whose packages a
# venv made from it would not see; --target installs the carried closure whole.
site="$work/site"
wheels_built="$work/wheels-built"
py3=python3
pip=("$py3" -m pip install --quiet --no-index --find-links "$root/wheels" --find-links "$wheels_built" --no-cache-dir)
# LLAMA_BUILD=OFF: the package's Python only (nothing compiled); its lib/ is then a
# link to the libraries above, where llama_cpp and localllm.engine (native.py,
# rpc.py) look for them. scikit-build-core, cmake, ninja: the device's.
run env CMAKE_ARGS=-DLLAMA_BUILD=OFF "$py3" -m pip wheel --quiet --no-index --no-build-isolation --no-deps -w "$wheels_built" "$src"
run "${pip[@]}" --target "$site" "$(echo "$root"/wheels/localllm-*.whl)" diskcache jinja2 typing-extensions numpy
run rm -rf "$site/llama_cpp/lib"
run ln -s "$lib" "$site/llama_cpp/lib"
if [ "$dry" = 1 ]; then
  # the closure, resolved for the device's CPython 3.12 from the carried wheels
  # alone: every requirement of localllm but llama-cpp-python (built above)
  reqs="$("${PYTHON:-$here/.venv/bin/python}" - "$(echo "$root"/wheels/localllm-*.whl)" <<'EOF2'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
for line in meta.splitlines():
    if line.startswith("Requires-Dist:") and "extra ==" not in line and "llama-cpp-python" not in line:
        print(line.split(":", 1)[1].strip())
EOF2
)"
  mapfile -t req_list <<<"$reqs"
  echo "   resolving ${#req_list[@]} requirements for CPython 3.12 from the carried wheels alone (pip download --no-index)"
  "${PYTHON:-$here/.venv/bin/python}" -m pip download --quiet --no-index --find-links "$root/wheels" \
    -d "$work/resolved" --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    "${req_list[@]}" diskcache jinja2 typing-extensions numpy 2>"$work/resolve.err" \
    || die "the carried wheels do not hold localllm's dependencies ($(grep -v '^WARNING' "$work/resolve.err" | tail -1))"
fi
run env "PYTHONPATH=$site" "$py3" -c \
  "from localllm.engine import gpu_offload_supported as g; import sys; ok = g(); print('   GPU offload:', ok); sys.exit(0 if ok else 1)"

step "gpu_compare.py (the table and the JSON under $out)"
note="Models rebuilt on the device from their GGUF headers with zero weights (same tensors, types and sizes)."
if [ "$dry" = 0 ]; then
  set -o pipefail
  rc=0
  # from the work folder: a child started with `python -m` (llama.cpp's dry run,
  # bench) would otherwise import the checkout's localllm/ before the installed one
  (cd "$work" && env "PYTHONPATH=$site" PYTHONUNBUFFERED=1 "$py3" "$here/scripts/gpu_compare.py" --out "$out" \
    --llama-bench "$lib/llama-bench" "${model_args[@]}" --note "$note ${name}.") 2>&1 | tee "$out/gpu_compare.log" || rc=$?
  # 1: a load failed or a figure differs from llama.cpp's (a planner bug: the table says which)
  step "gpu_compare.py exited $rc; done in $(( $(date +%s) - t0 )) s"
  exit "$rc"
else
  printf '+ cd %q &&' "$work"; printf ' %q' env "PYTHONPATH=$site" "$py3" "$here/scripts/gpu_compare.py" --out "$out" \
    --llama-bench "$lib/llama-bench" "${model_args[@]}"; printf '\n'
  # the CPU path, here: SmolLM2 rebuilt from its header, this checkout's llama.cpp
  py="${PYTHON:-$here/.venv/bin/python}"
  [ -x "$py" ] || py=python3
  echo "   dry: the CPU path, $py scripts/gpu_compare.py --quick on ${model_args[1]}"
  "$py" scripts/gpu_compare.py --quick --out "$out" "${model_args[0]}" "${model_args[1]}" --note "$note (CPU, --dry)"
fi
step "done in $(( $(date +%s) - t0 )) s"
