#!/usr/bin/env bash
# Build llama.cpp's own tools from the llama.cpp vendored in the pinned
# llama-cpp-python sdist, for the benchmarks' anchors (llama-bench, llama-server,
# llama-perplexity, llama-quantize; the RPC server runs from Python: localllm worker). Same source as localllm's engine,
# same AMX-off flags as scripts/install.sh, so a side-by-side figure compares
# code with code and not two llama.cpp versions.
#
#   scripts/build_llama_tools.sh            # prints the bin folder on stdout
#   scripts/build_llama_tools.sh --source   # only fetches the source; prints its folder
#
# Cached outside the repository in ~/.cache/localllm/llama.cpp-tools/<version>/
# (about 6 minutes on 2 cores the first time, nothing after).
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root="${XDG_CACHE_HOME:-$HOME/.cache}/localllm/llama.cpp-tools/$version"
bin="$root/build/bin"
tools=(llama-bench llama-server llama-perplexity llama-quantize)

src="$root/llama_cpp_python-$version/vendor/llama.cpp"
fetch_source() {
  if [ ! -f "$src/CMakeLists.txt" ]; then
    mkdir -p "$root"
    py="${PYTHON:-python3}"
    "$py" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$root" >&2
    tar xzf "$root/llama_cpp_python-$version.tar.gz" -C "$root"
  fi
}
case "${1:-}" in
  --source) fetch_source; echo "$src"; exit 0 ;;
  "") ;;
  *) echo "build_llama_tools.sh: unknown option $1 (use --source)" >&2; exit 2 ;;
esac

have_all=1
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || have_all=0; done
if [ "$have_all" = 1 ]; then echo "$bin"; exit 0; fi

fetch_source

flags=""
if [ "$(uname -s)" = "Linux" ] && [ "$(uname -m)" = "x86_64" ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" ${CMAKE_ARGS:-} >&2
cmake --build "$root/build" -j"$(nproc)" --target "${tools[@]}" >&2
echo "$bin"
