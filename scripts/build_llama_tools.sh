#!/usr/bin/env bash
# Build llama.cpp's own tools from the llama.cpp vendored in the pinned
# llama-cpp-python sdist, for the tests' and benchmarks' anchors (llama-bench,
# llama-server, llama-perplexity, llama-quantize, llama-mtmd-cli; the RPC server runs from Python:
# localllm worker). Same source as localllm's engine, same AMX-off flags as
# scripts/install.sh, so a side-by-side figure compares code with code and not
# two llama.cpp versions. scripts/install.sh --test runs it.
#
#   scripts/build_llama_tools.sh            # builds what is missing; prints the bin folder on stdout
#   scripts/build_llama_tools.sh --source   # only fetches the source; prints its folder
#   scripts/build_llama_tools.sh --paths    # builds and fetches nothing; prints bin=DIR and source=DIR
#                                           # (scripts/llama_tools.py reads it: one place computes the key)
#
# Cached outside the repository, under $XDG_CACHE_HOME (else ~/.cache) as the
# wheel is: the source in localllm/llama.cpp-tools/<version>/, the build in
# .../<version>/build-<key>/, keyed like scripts/install.sh's wheel (version,
# flags, CMAKE_ARGS, platform, the CPU's instruction sets: a -march=native build
# from another CPU is never reused). About 12 minutes on 2 cores, nothing after.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root="${XDG_CACHE_HOME:-$HOME/.cache}/localllm/llama.cpp-tools/$version"
tools=(llama-bench llama-server llama-perplexity llama-quantize llama-mtmd-cli)
src="$root/llama_cpp_python-$version/vendor/llama.cpp"

flags=""
os="$(uname -s)"; arch="$(uname -m)"
if [ "$os" = "Linux" ] && [ "$arch" = "x86_64" ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cpu=""
if [ -r /proc/cpuinfo ]; then
  cpu="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo || true)"
elif [ "$os" = "Darwin" ]; then
  cpu="$(sysctl -n machdep.cpu.brand_string 2>/dev/null || true)"
fi
# RPC is on in every build of the tools, so the key leaves it out: install.sh adds
# it to CMAKE_ARGS for the wheel, and a later lookup (--paths) without it must agree
user_args="$(printf '%s' "${CMAKE_ARGS:-}" | sed -E 's/(^| )-DGGML_RPC=(ON|on|1)( |$)/ /g; s/^ +//; s/ +$//')"
key="$(printf '%s|%s|%s|%s|%s|%s' "$version" "$flags" "$user_args" "$os" "$arch" "$cpu" | sha256sum | cut -c1-16)"
build="$root/build-$key"
bin="$build/bin"

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
  --paths) echo "bin=$bin"; echo "source=$src"; exit 0 ;;
  "") ;;
  *) echo "build_llama_tools.sh: unknown option $1 (use --source or --paths)" >&2; exit 2 ;;
esac

have_all=1
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || have_all=0; done
if [ "$have_all" = 1 ] && [ -f "$src/CMakeLists.txt" ]; then echo "$bin"; exit 0; fi

fetch_source
if [ "$have_all" = 1 ]; then echo "$bin"; exit 0; fi

echo "building llama.cpp's tools (${tools[*]}) into $build; about 12 minutes on 2 cores" >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" $user_args >&2
cmake --build "$build" -j"$(nproc)" --target "${tools[@]}" >&2
for t in "${tools[@]}"; do
  [ -x "$bin/$t" ] || { echo "build_llama_tools.sh: $t was not built in $bin" >&2; exit 1; }
done
echo "$bin"
